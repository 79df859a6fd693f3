"""Pods sharing one GPU's memory in simulated time, with the guard's pure policy in the loop.

The memory is the simulator's model (`backends.simulated.memory`: processes grow, and die
of OOM when the card is full, as CUDA does) and the decisions are the real policy's
(`core.guard.evaluate`); only the clock and the process exits are simulated: the guard
polls every `interval_s`, a signalled process lets go of its memory `exit_s` later. That
makes `gpuslice demo --scenario guard` and `bench/bench_guard.py` fast and deterministic;
the daemon test (`tests/e2e/test_memory_guard.py`) covers the real signals and Events.

With `caps` the GPU is capped by the driver (`core.caps`): each pod's cgroup gets soft =
its share and a hard limit by policy when it starts (the CDI hook's moment), or `caps_after_s`
later (the device-plugin window, the agent applying them), and the model enforces them
(`core.gpumemory` limits). The guard, where its mode is not `off`, runs beside them as the
agent's does (`core.protection.in_guard_view`): it steps back for a pod its cap holds, and
watches one whose cap came after it allocated more.

A pod may carry its own share and hard limit (`SimPod.share_mib`, `hard_mib`: what
`core.protection` gives it) and its holder (a claim several pods consume, `holder`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpuslice.backends.simulated.memory import Allocation, GpuMemoryModel, OomDeath
from gpuslice.core.caps import CapPolicy, MemoryLimits
from gpuslice.core.guard import (
    ContainerKey,
    GpuMemory,
    GuardParams,
    GuardState,
    Tenant,
    evaluate,
    lookahead_for,
)
from gpuslice.core.guard.model import GuardMode
from gpuslice.core.protection import in_guard_view
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB

GPU_UUID = "GPU-sim-0"

Fate = Literal["running", "oom", "capped", "reclaimed"]
"""`oom`: an allocation failed for want of free memory; `capped`: one failed at its own
cgroup's hard limit; `reclaimed`: the guard stopped it."""


@dataclass(frozen=True, slots=True)
class SimPod:
    name: str
    allocation: Allocation
    start_s: float = 0.0
    replicas: int = 1
    """Time-slicing replicas it holds (its share is memory/replicas x this)."""
    well_behaved: bool = True
    """Stays within its share (what the bench counts as a pod that must not be lost)."""
    share_mib: int | None = None
    """Its guaranteed share (the soft limit, the guard's share); None: memory / replicas x
    `replicas`."""
    soft_mib: int | None = None
    """Its soft limit under caps; None: its share (a claim's consumer gets its part)."""
    hard_mib: int | None = None
    """Its hard limit under caps; None: by the caps policy (the share, or the whole GPU)."""
    holder: str | None = None
    """The claim it consumes with other pods, held together to one share (`Tenant.holder`)."""


@dataclass(frozen=True, slots=True)
class SimEvent:
    at: float
    pod: str
    what: str
    """`started`, `oom`, `over-share`, `reclaim`, `would-reclaim`, `exited`."""
    used_mib: int = 0
    free_mib: int = 0


@dataclass(slots=True)
class SimResult:
    events: list[SimEvent] = field(default_factory=list)
    fates: dict[str, Fate] = field(default_factory=dict)
    reactions_s: list[float] = field(default_factory=list)
    """For each time free memory fell below the reserve: seconds until the first signal."""
    peak_used_mib: dict[str, int] = field(default_factory=dict)
    last_used_mib: dict[str, int] = field(default_factory=dict)
    """What each pod held at the end (or when it last held memory)."""

    def lost(self, pods: Sequence[SimPod]) -> list[str]:
        """Well-behaved pods that died of a failed allocation (OOM or their own cap)."""
        return [
            p.name for p in pods if p.well_behaved and self.fates.get(p.name) in ("oom", "capped")
        ]

    def stopped(self) -> int:
        """Pods the guard stopped."""
        return sum(1 for f in self.fates.values() if f == "reclaimed")


def simulate(
    total_mib: int,
    replicas: int,
    pods: Sequence[SimPod],
    params: GuardParams,
    *,
    interval_s: float = 1.0,
    until_s: float = 120.0,
    step_s: float = 0.05,
    exit_s: float = 0.2,
    first_poll_s: float = 0.0,
    caps: CapPolicy | None = None,
    caps_after_s: float = 0.0,
    client_limits_mib: Mapping[str, int] | None = None,
) -> SimResult:
    """Run `pods` on one GPU of `total_mib` split in `replicas`, the guard polling, and/or
    the driver capping each pod (`caps`: the hard limit's policy) from `caps_after_s` after
    it starts, the guard stepping back for the pods their cap holds.
    `client_limits_mib`: pod -> the most its process may allocate whatever the guard does,
    as an MPS server's pinned limit holds a client (no guarantee below it); the guard goes
    on polling and sees those pods as MPS tenants."""
    model = GpuMemoryModel(total_mib, step_s=step_s)
    result = SimResult()
    pid_of = {p.name: 1000 + i for i, p in enumerate(pods)}
    by_pid = {pid: name for name, pid in pid_of.items()}
    share = {
        p.name: (
            p.share_mib * MIB
            if p.share_mib is not None
            else total_mib * MIB * p.replicas // replicas
        )
        for p in pods
    }

    def limits_of(pod: SimPod) -> tuple[int, int]:
        soft = share[pod.name] // MIB if pod.soft_mib is None else pod.soft_mib
        if pod.hard_mib is not None:
            return soft, pod.hard_mib
        return soft, soft if caps == "strict" else total_mib

    group_of = {p.name: f"/sys/fs/cgroup/kubepods.slice/{p.name}" for p in pods}
    capping: dict[str, tuple[float, SimPod]] = {}
    """Pod -> when the agent applies its limits (after the window), and the pod."""
    capped: dict[str, tuple[int, int]] = {}
    """Pod -> its limits (MiB), once applied."""
    reserve_mib = params.reserve.of(total_mib * MIB) // MIB
    pending_start = sorted(pods, key=lambda p: (p.start_s, p.name))
    exiting: dict[str, float] = {}
    state = GuardState()
    next_poll = first_poll_s
    below_since: float | None = None
    reacted = False
    t = 0.0
    model.advance(0.0)

    def note(at: float, pod: str, what: str) -> None:
        used = model.usage(pid_of[pod]) or 0
        result.events.append(SimEvent(at, pod, what, used, model.free_mib))

    def record_deaths(deaths: Sequence[OomDeath]) -> None:
        for d in deaths:
            name = by_pid[d.pid]
            what: Fate = "capped" if d.reason == "hard-limit" else "oom"
            result.fates[name] = what
            result.events.append(SimEvent(d.at, name, what, d.wanted_mib, d.free_mib))

    while t <= until_s + 1e-9:
        while pending_start and pending_start[0].start_s <= t + 1e-9:
            pod = pending_start.pop(0)
            group = None
            if caps is not None:
                group = group_of[pod.name]
                if caps_after_s <= 0:
                    capped[pod.name] = limits_of(pod)
                    model.set_limits(group, *capped[pod.name])
                else:
                    capping[pod.name] = (t + caps_after_s, pod)
            elif client_limits_mib is not None and pod.name in client_limits_mib:
                group = f"/mps/{pod.name}"
                model.set_limits(group, 0, client_limits_mib[pod.name])
            death = model.start(pid_of[pod.name], pod.allocation, t, group=group)
            result.fates[pod.name] = "running"
            if death is None:
                note(t, pod.name, "started")
            else:
                record_deaths([death])
        record_deaths(model.advance(t))
        for name, (at, late) in list(capping.items()):
            if t + 1e-9 >= at:
                del capping[name]
                capped[name] = limits_of(late)
                model.set_limits(group_of[name], *capped[name])
        for name, at in list(exiting.items()):
            if t + 1e-9 >= at:
                model.stop(pid_of[name])
                del exiting[name]
                if result.fates.get(name) == "running":
                    result.fates[name] = "reclaimed"
                result.events.append(SimEvent(t, name, "exited", 0, model.free_mib))
        for name, pid in pid_of.items():
            used = model.usage(pid)
            if used is not None:
                result.peak_used_mib[name] = max(result.peak_used_mib.get(name, 0), used)
                result.last_used_mib[name] = used
        if model.free_mib < reserve_mib:
            if below_since is None:
                below_since, reacted = t, False
        elif below_since is not None and not exiting:
            below_since = None
        if t + 1e-9 >= next_poll and params.mode != "off":
            next_poll += interval_s
            tenants = [
                Tenant(
                    ContainerKey("default", p.name, "main"),
                    GPU_UUID,
                    (
                        SharingStrategy.MPS
                        if client_limits_mib is not None
                        else SharingStrategy.TIME_SLICING
                    ),
                    share[p.name],
                    (model.usage(pid_of[p.name]) or 0) * MIB,
                    (pid_of[p.name],),
                    holder=p.holder,
                )
                for p in pods
                if model.usage(pid_of[p.name]) is not None
            ]
            confirmed = {
                (t.key, GPU_UUID): MemoryLimits(
                    capped[t.key.pod][0] * MIB, capped[t.key.pod][1] * MIB, t.used_bytes
                )
                for t in tenants
                if t.key.pod in capped
            }
            tenants = list(in_guard_view(tenants, confirmed))
            gpu = GpuMemory(GPU_UUID, 0, total_mib * MIB, model.free_mib * MIB)
            ev = evaluate([gpu], tenants, state, params, t)
            state = ev.state
            for d in ev.decisions:
                name = d.key.pod
                if d.kind == "over-share":
                    note(t, name, "over-share")
                elif d.kind == "reclaim" and not d.enforced:
                    note(t, name, "would-reclaim")
                elif d.kind == "reclaim":
                    note(t, name, "reclaim")
                    exiting.setdefault(name, t + exit_s)
                    if below_since is not None and not reacted:
                        result.reactions_s.append(t - below_since)
                        reacted = True
                elif d.kind == "escalate":
                    exiting[name] = t
        t = round(t + step_s, 9)
    return result


@dataclass(frozen=True, slots=True)
class Outcomes:
    """One story told three ways: nothing between the pods (NVIDIA's device plugin), the
    memory guard enforcing with its defaults, and the driver's caps (soft = hard = share)."""

    params: GuardParams
    """The enforcing guard's parameters (reserve 10 %, grace 1 s: the agent's defaults)."""
    nothing: SimResult
    guard: SimResult
    caps: SimResult


def outcomes(
    total_mib: int,
    replicas: int,
    pods: Sequence[SimPod],
    *,
    interval_s: float,
    until_s: float,
) -> Outcomes:
    """The guard demo's and the default demo's three runs of the same pods."""
    defaults = GuardParams(mode="enforce")
    lookahead = lookahead_for(interval_s)

    def run(params: GuardParams, caps: CapPolicy | None = None) -> SimResult:
        return simulate(
            total_mib, replicas, pods, params, interval_s=interval_s, until_s=until_s, caps=caps
        )

    def guard(mode: GuardMode) -> GuardParams:
        return GuardParams(
            mode=mode, reserve=defaults.reserve, grace_s=defaults.grace_s, lookahead_s=lookahead
        )

    return Outcomes(
        defaults, run(guard("off")), run(guard("enforce")), run(GuardParams(mode="off"), "strict")
    )
