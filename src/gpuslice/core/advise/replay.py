"""The history played again at a replica count: what would have happened to each pod.

No second model: the GPUs are the simulator's memory model (`core.gpumemory`: a pod that
allocates into a full card dies of OOM, as under CUDA), each pod asks it for exactly what
it was scraped using (`RecordedDemand`), and the guard is the agent's own policy
(`core.guard.evaluate`), polled once per scrape. Pods are placed as the scheduler would
place `nvidia.com/gpu: 1` on replicas: at its first sample, on the first GPU with a free
replica, a new GPU when none has one; a pod leaves at its last sample (or when it dies or
is stopped). Run once with the guard off (who dies of OOM, as with NVIDIA's plugin), once
enforcing (who the guard stops, and who still dies), and once capped by the driver
(`core.caps`, strict: soft = hard = the share, from the pod's first sample, the guard
stepped back): whose own allocation fails at its cap, and who still dies of OOM.

What it cannot know: a pod killed here would have been restarted by the kubelet and
its work redone; the replay counts it once and lets it go. Pods kept their recorded
start times, though sharing more densely would also have started some earlier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuslice.core.advise.history import PodTrace
from gpuslice.core.gpumemory import GpuMemoryModel, RecordedDemand
from gpuslice.core.guard import (
    ContainerKey,
    GpuMemory,
    GuardParams,
    GuardState,
    Tenant,
    evaluate,
    lookahead_for,
)
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    replicas: int
    gpus: int
    """GPUs the placement opened."""
    whole_gpus: int
    """GPUs the same pods need without sharing: the most that ran at one time."""
    oom_without_guard: tuple[str, ...]
    stopped_by_guard: tuple[str, ...]
    oom_with_guard: tuple[str, ...]
    capped_with_caps: tuple[str, ...] = ()
    """Pods whose own allocation failed at their hard limit, with caps."""
    oom_with_caps: tuple[str, ...] = ()
    """Pods that still died for want of free memory, with caps."""

    @property
    def gpus_saved(self) -> int:
        return self.whole_gpus - self.gpus


def replay_params(step_s: float) -> GuardParams:
    """The agent's defaults, enforcing, polled once per scrape."""
    return GuardParams(mode="enforce", lookahead_s=lookahead_for(step_s))


def replay(
    traces: Sequence[PodTrace],
    memory_mib: int,
    replicas: int,
    step_s: float,
    *,
    skip_quiet: bool = True,
) -> ReplayOutcome:
    """`skip_quiet=False` shows every GPU to the policy at every poll, as the agent does;
    the default leaves out the GPUs where it provably decides nothing (`_quiet`), which
    gives the same outcome (tested) in a fraction of the time."""
    ordered = sorted(traces, key=lambda t: (t.first, t.key, t.gpu_uuid))
    gpus, oom_off, _ = _run(ordered, memory_mib, replicas, step_s, None, skip_quiet)
    params = replay_params(step_s)
    _, oom_on, stopped = _run(ordered, memory_mib, replicas, step_s, params, skip_quiet)
    _, died_capped, _ = _run(ordered, memory_mib, replicas, step_s, None, skip_quiet, caps=True)
    at_cap = {pid for pid, reason in died_capped.items() if reason == "hard-limit"}
    return ReplayOutcome(
        replicas=replicas,
        gpus=gpus,
        whole_gpus=most_at_once(ordered),
        oom_without_guard=_names(ordered, set(oom_off)),
        stopped_by_guard=_names(ordered, stopped),
        oom_with_guard=_names(ordered, set(oom_on)),
        capped_with_caps=_names(ordered, at_cap),
        oom_with_caps=_names(ordered, set(died_capped) - at_cap),
    )


def _quiet(
    gpu: GpuMemory, used: Sequence[int], share: int, state: GuardState, reserve: int
) -> bool:
    """Whether the policy provably decides nothing about this GPU at this poll, and keeps
    nothing about it but its tenants' usage: no tenant over its share (only those are
    reported, projected or reclaimed), not under pressure since an earlier poll, and its
    free memory at or above the reserve (with no borrower, the projection is the free
    memory itself)."""
    return (
        gpu.uuid not in state.pressure_since
        and gpu.free_bytes >= reserve
        and all(u <= share for u in used)
    )


def most_at_once(traces: Sequence[PodTrace]) -> int:
    edges = sorted([(t.first, 1) for t in traces] + [(t.last + 1, -1) for t in traces])
    most = running = 0
    for _, delta in edges:
        running += delta
        most = max(most, running)
    return most


def _names(traces: Sequence[PodTrace], pids: set[int]) -> tuple[str, ...]:
    return tuple(sorted({traces[pid].name for pid in pids}))


def _run(
    traces: Sequence[PodTrace],
    memory_mib: int,
    replicas: int,
    step_s: float,
    params: GuardParams | None,
    skip_quiet: bool,
    *,
    caps: bool = False,
) -> tuple[int, dict[int, str], set[int]]:
    """(GPUs opened, pids whose allocation failed -> why, pids stopped by the guard); a pid
    is an index into `traces`. With `caps`, each pod's cgroup gets soft = hard = the share
    when it starts (and loses them when it leaves)."""
    models: list[GpuMemoryModel] = []
    holders: list[set[int]] = []
    where: dict[int, int] = {}
    dead: dict[int, str] = {}
    stopped: set[int] = set()
    share = memory_mib * MIB // replicas
    state = GuardState()
    if not traces:
        return 0, dead, stopped
    begin = traces[0].first
    end = max(t.last for t in traces)
    pending = 0
    leaving: dict[int, list[int]] = {}
    for pid, t in enumerate(traces):
        leaving.setdefault(t.last + 1, []).append(pid)
    # Unique per trace: a container seen on two GPUs, or twice, is two tenants here.
    keys = [
        ContainerKey(t.key.namespace, t.key.pod, f"{t.key.container}#{pid}")
        for pid, t in enumerate(traces)
    ]
    reserve = 0 if params is None else params.reserve.of(memory_mib * MIB)

    def leave(pid: int) -> None:
        gpu = where.pop(pid)
        models[gpu].stop(pid)
        models[gpu].clear_limits(str(pid))
        holders[gpu].discard(pid)

    for k in range(begin, end + 2):
        now = k * step_s
        for pid in leaving.pop(k, ()):
            if pid in where:
                leave(pid)
        for gpu, model in enumerate(models):
            for death in model.advance(now):
                dead[death.pid] = death.reason
                model.clear_limits(str(death.pid))
                where.pop(death.pid, None)
                holders[gpu].discard(death.pid)
        while pending < len(traces) and traces[pending].first <= k:
            pid = pending
            pending += 1
            gpu = next((i for i, h in enumerate(holders) if len(h) < replicas), len(models))
            if gpu == len(models):
                models.append(GpuMemoryModel(memory_mib, step_s=step_s))
                models[gpu].advance(now)
                holders.append(set())
            holders[gpu].add(pid)
            where[pid] = gpu
            group = None
            if caps:
                group = str(pid)
                models[gpu].set_limits(group, share // MIB, share // MIB)
            demand = RecordedDemand(traces[pid].memory_mib, step_s)
            failed = models[gpu].start(pid, demand, now, group=group)
            if failed is not None:
                dead[pid] = failed.reason
                models[gpu].clear_limits(str(pid))
                where.pop(pid, None)
                holders[gpu].discard(pid)
        if params is None or not where:
            continue
        tenants: list[Tenant] = []
        views: list[GpuMemory] = []
        quiet: dict[tuple[ContainerKey, str], tuple[float, int]] = {}
        for gpu, model in enumerate(models):
            if not holders[gpu]:
                continue
            pids = sorted(holders[gpu])
            used = [(model.usage(pid) or 0) * MIB for pid in pids]
            view = GpuMemory(str(gpu), gpu, memory_mib * MIB, model.free_mib * MIB)
            if skip_quiet and _quiet(view, used, share, state, reserve):
                quiet.update(
                    {(keys[p], view.uuid): (now, u) for p, u in zip(pids, used, strict=True)}
                )
                continue
            tenants.extend(
                Tenant(keys[p], view.uuid, SharingStrategy.TIME_SLICING, share, u, (p,))
                for p, u in zip(pids, used, strict=True)
            )
            views.append(view)
        ev = evaluate(views, tenants, state, params, now)
        state = ev.state
        if quiet:
            # What `evaluate` would have kept of the quiet GPUs: their tenants' usage,
            # from which the next poll measures growth.
            quiet.update(state.last_used)
            state = replace(state, last_used=quiet)
        for d in ev.decisions:
            if d.kind in ("reclaim", "escalate") and d.enforced:
                pid = d.pids[0]
                if pid in where:
                    stopped.add(pid)
                    leave(pid)
    return len(models), dead, stopped
