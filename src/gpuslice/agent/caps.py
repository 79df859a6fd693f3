"""The agent's side of memory caps: find what the node allows, and hold every shared
container's cgroup to its limits where no CDI hook did it before the container ran.

Each round (the guard's poll, off the event loop: NVML and the cgroup filesystem block):
the containers that should be capped (`core.caps.wanted_limits`, from the kubelet's
PodResources and the plan) are looked up in the cgroup filesystem by pod UID and container
ID (the pod watch gives both as soon as the container has started); each one's limits are
read back with `nvmlDeviceGetMemoryLimits_v1` and set (or repaired) when missing or
different, then read again. The *window*, from the container's cgroup being created (its
directory's timestamp) to its limits being confirmed, is measured: it is the time a
workload ran uncapped, which a CDI hook makes zero.

A refusal (a driver without the call, MIG, an NVML error) takes the GPU out of caps for
the agent's life, logged once with its reason: the guard takes over there, as on a GPU
that never could. A container that is gone (no cgroup, NVML's NOT_FOUND) is forgotten
quietly: removing a cgroup clears its limits. Nothing here can refuse a pod: the worst a
failure does is leave a GPU to the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuslice.core.caps import (
    REFUSAL_TEXT,
    CapPolicy,
    CapsMode,
    GpuCapability,
    MemoryLimits,
    NodeCapability,
    Refusal,
    cgroup_candidates,
    check_outcome,
    gpu_capability,
    wanted_limits,
)
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.caps import CdiCaps
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.sharing.model import Plan
from gpuslice.logs import get_logger
from gpuslice.ports import MemoryLimiter, MemoryLimitsError, PodAssignments

log = get_logger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def node_capability(cgroup_root: Path = CGROUP_ROOT, *, euid: int | None = None) -> NodeCapability:
    """cgroup v2 is the unified hierarchy, whose root has `cgroup.controllers` (v1 has a
    directory per controller and no such file); root is the effective UID 0."""
    v2 = (cgroup_root / "cgroup.controllers").is_file()
    return NodeCapability(cgroup_v2=v2, root=(os.geteuid() if euid is None else euid) == 0)


def gpu_capabilities(
    inventory: Inventory,
    limiter: MemoryLimiter | None,
    node: NodeCapability,
    mode: CapsMode,
) -> dict[str, GpuCapability]:
    """Each GPU's capability, once at start; each refusal logged once (`caps-unavailable`)."""
    has_call = False
    if limiter is not None and mode != "off":
        try:
            has_call = limiter.memory_limits_supported()
        except Exception as exc:  # a probe must never stop the agent
            log.warning("caps-probe-failed", error=str(exc))
    out: dict[str, GpuCapability] = {}
    for gpu in inventory.gpus:
        cap = gpu_capability(
            gpu.uuid,
            mode=mode,
            mig_enabled=gpu.mig_enabled,
            memory_reported=gpu.memory_reported,
            driver_has_call=has_call,
            node=node,
        )
        out[gpu.uuid] = cap
        if cap.refusal not in (None, "caps-off"):
            log.info("caps-unavailable", gpu=gpu.uuid, refusal=cap.refusal, reason=cap.reason)
    return out


def resolve_cgroup(cgroup_root: Path, pod_uid: str, container_id: str) -> str | None:
    """The container's cgroup as NVML's `nameSpace` (the full sysfs path), or None."""
    for rel in cgroup_candidates(pod_uid, container_id):
        path = cgroup_root / rel
        if path.is_dir():
            return str(path)
    return None


@dataclass(frozen=True, slots=True)
class CapsRound:
    """What one round did, for logs and tests."""

    set: int = 0
    repaired: int = 0
    raised: int = 0
    """Limits found above the container's share (a tenant's own), set back to it."""
    ok: int = 0
    gone: int = 0
    refused: tuple[tuple[str, Refusal], ...] = ()


WINDOWS_KEPT = 1024
"""Windows kept for the metric's quantiles (a few hours of container starts on a busy node)."""


class CapsApplier:
    """Applies, checks and repairs per-container limits; remembers what it confirmed."""

    def __init__(
        self,
        limiter: MemoryLimiter,
        capabilities: Mapping[str, GpuCapability],
        *,
        cgroup_root: Path = CGROUP_ROOT,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._limiter = limiter
        self._capabilities = dict(capabilities)
        self._root = cgroup_root
        self._clock = wall_clock
        self._confirmed: dict[tuple[ContainerKey, str], MemoryLimits] = {}
        self._paths: dict[tuple[ContainerKey, str], str] = {}
        self._told: set[tuple[ContainerKey, str]] = set()
        self.windows_s: list[float] = []
        """Per container and GPU, cgroup creation -> limits confirmed, in seconds: the
        latest WINDOWS_KEPT, since every scrape sorts them for the window's quantiles and
        a node's containers come and go for the agent's whole life."""

    @property
    def capabilities(self) -> dict[str, GpuCapability]:
        return dict(self._capabilities)

    def capped(self) -> frozenset[tuple[ContainerKey, str]]:
        """(container, GPU) pairs whose limits were confirmed on the last round."""
        return frozenset(self._confirmed)

    def readings(self) -> dict[tuple[ContainerKey, str], MemoryLimits]:
        """The limits last read back, with the memory each cgroup used (`used_bytes`)."""
        return dict(self._confirmed)

    def sync(
        self,
        wanted: Mapping[tuple[ContainerKey, str], MemoryLimits],
        cgroups: Mapping[ContainerKey, str],
    ) -> CapsRound:
        """One round (blocking). `cgroups`: container -> its cgroup's full path, for the
        containers the pod watch has seen started (`resolve_cgroup`)."""
        counts = {"set": 0, "repaired": 0, "raised": 0, "ok": 0, "gone": 0}
        refused: list[tuple[str, Refusal]] = []
        confirmed: dict[tuple[ContainerKey, str], MemoryLimits] = {}
        for (key, gpu), limits in sorted(wanted.items()):
            cap = self._capabilities.get(gpu)
            path = cgroups.get(key)
            if cap is None or not cap.capable or path is None:
                continue
            if limits.soft_bytes > limits.hard_bytes:
                # The toolkit's hook refuses this; NVML's answer is not documented: never asked.
                if (key, gpu) not in self._told:
                    self._told.add((key, gpu))
                    log.warning(
                        "caps-request-above-limit",
                        container=str(key),
                        gpu=gpu,
                        limits=str(limits),
                        then="not capped; the guard watches it",
                    )
                continue
            try:
                read = self._limiter.get_memory_limits(gpu, path)
                outcome = check_outcome(limits, read)
                if outcome == "raised":
                    log.warning(
                        "caps-limit-raised",
                        container=str(key),
                        gpu=gpu,
                        cgroup=path,
                        found=str(read),
                        share=str(limits),
                        then="set back to its share; the guard watches it until confirmed",
                    )
                if outcome != "ok":
                    self._limiter.set_memory_limits(gpu, path, limits)
                    read = self._limiter.get_memory_limits(gpu, path)
                    if not read.same_limits(limits):
                        raise MemoryLimitsError(
                            "nvml-error", f"GPU {gpu}, cgroup {path}: read back {read}"
                        )
                    log.info(
                        "caps-applied",
                        container=str(key),
                        gpu=gpu,
                        cgroup=path,
                        limits=str(limits),
                        outcome=outcome,
                    )
                counts[outcome] += 1
            except MemoryLimitsError as exc:
                if exc.refusal == "gone":
                    counts["gone"] += 1
                    log.debug("caps-container-gone", container=str(key), gpu=gpu, error=str(exc))
                    continue
                refusal: Refusal = "nvml-error"
                if exc.refusal == "driver-without-call":
                    refusal = "driver-without-call"
                elif exc.refusal == "mig":
                    refusal = "mig"
                self._capabilities[gpu] = GpuCapability(gpu, refusal)
                refused.append((gpu, refusal))
                log.warning(
                    "caps-refused",
                    gpu=gpu,
                    refusal=refusal,
                    error=str(exc),
                    then="the memory guard watches this GPU instead",
                )
                continue
            pair = (key, gpu)
            if outcome != "ok" and pair not in self._confirmed:
                # The agent's own first apply: the time the workload could run uncapped. A
                # container whose limits were already there (the CDI hook) had no window.
                self._measure(path)
            confirmed[pair] = read
            self._paths[pair] = path
        self._confirmed = confirmed
        self._paths = {p: self._paths[p] for p in confirmed}
        return CapsRound(refused=tuple(refused), **counts)

    def _measure(self, path: str) -> None:
        try:
            born = os.stat(path).st_mtime
        except OSError:
            return
        self.windows_s.append(max(0.0, self._clock() - born))
        del self.windows_s[:-WINDOWS_KEPT]


def live_cgroups(
    cgroup_root: Path, containers: Iterable[tuple[ContainerKey, str, str]]
) -> dict[ContainerKey, str]:
    """container -> its cgroup path, for (container, pod UID, container ID) triples from the
    pod watch; containers whose cgroup is not (or no longer) there are left out."""
    out: dict[ContainerKey, str] = {}
    for key, uid, cid in containers:
        path = resolve_cgroup(cgroup_root, uid, cid)
        if path is not None:
            out[key] = path
    return out


def process_cgroups(
    cgroup_root: Path, proc_root: Path, pids_by_container: Mapping[ContainerKey, Iterable[int]]
) -> dict[ContainerKey, str]:
    """container -> its cgroup path, from its GPU processes' `/proc/<pid>/cgroup` (the
    cgroup v2 line, `0::/path`): the fallback when the pod watch is not there (no API
    access), at the cost of seeing a container only once it has a GPU context."""
    out: dict[ContainerKey, str] = {}
    for key, pids in pids_by_container.items():
        for pid in pids:
            try:
                text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8")
            except OSError:
                continue
            rel = next((ln[3:].strip() for ln in text.splitlines() if ln.startswith("0::")), None)
            if rel:
                path = cgroup_root / rel.lstrip("/")
                if path.is_dir():
                    out[key] = str(path)
                    break
    return out


PodsSource = Callable[[], Iterable[tuple[ContainerKey, str, str]] | None]
"""(container, pod UID, container ID) of the started containers the pod watch knows; None
without a pod watch (no API access)."""


class CapsService:
    """The agent's caps loop: every `interval_s`, the round `CapsApplier.sync` describes,
    for the containers PodResources lists on capable GPUs. A node where no GPU is capable
    (every node before r615) does nothing at all after the first look."""

    def __init__(
        self,
        applier: CapsApplier,
        *,
        policy: CapPolicy,
        current_plan: Callable[[], Plan | None],
        assignments: PodAssignments | None,
        pods: PodsSource | None = None,
        pids: Callable[[], Mapping[ContainerKey, Iterable[int]]] | None = None,
        cgroup_root: Path = CGROUP_ROOT,
        proc_root: Path = Path("/proc"),
        interval_s: float = 1.0,
    ) -> None:
        self.applier = applier
        self.policy = policy
        self._plan = current_plan
        self._assignments = assignments
        self._pods = pods
        self._pids = pids
        self._root = cgroup_root
        self._proc = proc_root
        self.interval_s = interval_s
        self.rounds = 0

    def any_capable(self) -> bool:
        return any(c.capable for c in self.applier.capabilities.values())

    async def round(self) -> CapsRound | None:
        plan = self._plan()
        if plan is None or self._assignments is None or not self.any_capable():
            return None
        held = await self._assignments.list_assignments()
        wanted = wanted_limits(held, plan, self.applier.capabilities, self.policy)
        if not wanted:
            return None
        keys = {k for k, _ in wanted}
        listed = self._pods() if self._pods is not None else None
        triples = [t for t in (listed or ()) if t[0] in keys]
        cgroups = await asyncio.to_thread(live_cgroups, self._root, triples)
        missing = keys - set(cgroups)
        if missing and self._pids is not None:
            pids = {k: list(v) for k, v in self._pids().items() if k in missing}
            cgroups.update(await asyncio.to_thread(process_cgroups, self._root, self._proc, pids))
        self.rounds += 1
        return await asyncio.to_thread(self.applier.sync, wanted, cgroups)

    async def run(self, stop: asyncio.Event) -> None:
        if not self.any_capable():
            return
        log.info("caps-started", policy=self.policy, interval_s=self.interval_s)
        while not stop.is_set():
            try:
                await self.round()
            except Exception:
                log.exception("caps-round-failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)


class _PodLike(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def containers(self) -> tuple[tuple[str, str], ...]: ...


def pod_containers(pods: Iterable[_PodLike] | None) -> list[tuple[ContainerKey, str, str]] | None:
    """(container, pod UID, container ID) for each started container of the pod watch's
    entries (`k8s.pods.PodEntry`); None before the watch's first list."""
    if pods is None:
        return None
    return [
        (ContainerKey(p.namespace, p.name, name), p.uid, cid)
        for p in pods
        for cid, name in p.containers
    ]


def cdi_hook(
    hook_path: str, driver_root: str, node: NodeCapability, any_capable: bool
) -> CdiCaps | None:
    """How the DRA claim specs call the toolkit's hook, None for no hook. A hook that fails
    refuses the pod (the runtime fails the container), so it is written only where it can
    work: a node able to take limits (cgroup v2, root) with a capable GPU, and the hook's
    file there at `hook_path` as the agent sees it (in the chart, a path the DaemonSet
    mounts). Anywhere else the agent applies the limits itself after the container starts;
    the reason is logged once."""
    if not hook_path:
        return None
    refusal = node.refusal()
    why = ""
    if refusal is not None:
        why = REFUSAL_TEXT[refusal]
    elif not any_capable:
        why = "no GPU of this node can be capped"
    elif not Path(hook_path).is_file():
        why = f"no hook program at {hook_path} (mount it, or set --memory-caps-hook-path)"
    if why:
        log.info("caps-hook-off", path=hook_path, reason=why, then="the agent applies the limits")
        return None
    return CdiCaps(hook_path, driver_root)
