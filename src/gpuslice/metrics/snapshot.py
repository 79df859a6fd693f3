"""The exporter's one source of truth: a snapshot refreshed off the scrape path.

NVML calls can take tens of milliseconds per GPU and block; the kubelet can be restarting.
A scrape must do neither, so a loop gathers everything (backend telemetry and processes in a
worker thread, PodResources over gRPC, `/proc` reads) into a frozen `MetricsSnapshot` every
`interval_s`, and the Prometheus collector and `gpuslice top` only read the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.attribution import Attribution, attribute
from gpuslice.core.cgroups import CgroupIdentity, ContainerId, PodUid
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import Plan
from gpuslice.logs import get_logger
from gpuslice.metrics.procfs import DEFAULT_PROC_ROOT, cgroup_identities
from gpuslice.ports import ContainerDevices, GpuBackend, GpuProcess, GpuStatus, PodAssignments

log = get_logger("gpuslice.metrics")

CurrentPlan = Callable[[], tuple[Plan, Inventory] | None]
"""The plan in force and the inventory it was built from (None before the first plan)."""
PodUidMap = Callable[[], Mapping[PodUid, tuple[str, str]] | None]
"""Pod UID -> (namespace, name), from the API server when available."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int | None
    """None when the backend reports a GPU the inventory does not know (yet)."""
    uuid: str
    model: str
    memory_total_mib: int
    status: GpuStatus


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    taken_at: float
    """Wall-clock seconds (the injected clock) when the refresh finished."""
    hostname: str
    gpus: tuple[GpuSample, ...]
    attribution: Attribution
    advertised: Mapping[str, int]
    """resource -> advertised device count in the plan in force."""
    allocated: Mapping[str, int]
    """resource -> how many of those devices PodResources says a container holds."""
    processes: tuple[GpuProcess, ...] = ()
    problems: tuple[str, ...] = ()
    """What could not be read this time (shown by `top`, logged by the loop)."""


EMPTY_ATTRIBUTION = Attribution(usages=(), unattributed=(), unknown_device_ids=(), learned_pods={})


@dataclass(frozen=True, slots=True)
class _BackendRead:
    statuses: tuple[GpuStatus, ...]
    processes: tuple[GpuProcess, ...]
    identities: dict[int, CgroupIdentity]
    problems: tuple[str, ...] = field(default=())


class SnapshotRefresher:
    """Builds `MetricsSnapshot`s; `latest` is what the collector reads."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        assignments: PodAssignments | None,
        current: CurrentPlan,
        hostname: str,
        proc_root: Path = DEFAULT_PROC_ROOT,
        pods: PodUidMap | None = None,
        container_names: Callable[[], Mapping[ContainerId, str] | None] | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.assignments = assignments
        self.current = current
        self.hostname = hostname
        self.proc_root = proc_root
        self.pods = pods
        self.container_names = container_names
        self.interval_s = interval_s
        """Seconds between refreshes; scrapes in between see the same snapshot."""
        self.clock = clock
        self.monotonic = monotonic
        """Ages snapshots for `fresh` (the wall clock `clock` stamps them for people)."""
        self._latest: MetricsSnapshot | None = None
        self._refreshed_at = -math.inf
        self._last_assignments: tuple[ContainerDevices, ...] = ()
        self.updated = asyncio.Event()
        """Set after each refresh (tests and `top --watch` wait on it, then clear it)."""

    @property
    def latest(self) -> MetricsSnapshot | None:
        return self._latest

    def read_latest(self) -> MetricsSnapshot | None:
        """`latest` as a method: what the exporter's collector is handed."""
        return self._latest

    async def run(self, stop: asyncio.Event) -> None:
        reported: set[str] = set()
        while not stop.is_set():
            try:
                latest = self._latest
                snap = latest if latest is not None and self.fresh() else await self.refresh()
            except Exception:
                log.exception("metrics-refresh-failed")
            else:
                # Log a problem when it starts, not on every refresh while it lasts.
                for problem in sorted(set(snap.problems) - reported):
                    log.warning("metrics-partial", problem=problem)
                reported = set(snap.problems)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)

    def fresh(self) -> bool:
        """The latest snapshot is younger than `interval_s`: another poller (the memory
        guard, which refreshes this same snapshot every second) already did this loop's
        work, so the loop skips its refresh instead of reading NVML and /proc twice."""
        return self.monotonic() - self._refreshed_at < self.interval_s

    async def refresh(self) -> MetricsSnapshot:
        read = await asyncio.to_thread(self._read_backend)
        problems = list(read.problems)
        assignments = self._last_assignments
        if self.assignments is not None:
            try:
                assignments = await self.assignments.list_assignments()
            except Exception as exc:
                problems.append(f"pod assignments unavailable, using the last list: {exc}")
            else:
                self._last_assignments = assignments
        current = self.current()
        if current is None:
            plan, inventory = Plan(resources=()), None
        else:
            plan, inventory = current
        uid_map = self.pods() if self.pods is not None else None
        names = self.container_names() if self.container_names is not None else None
        attribution = attribute(
            assignments,
            plan,
            read.processes,
            read.identities,
            uid_map,
            inventory=inventory,
            container_names=names,
        )
        snap = MetricsSnapshot(
            taken_at=self.clock(),
            hostname=self.hostname,
            gpus=_gpu_samples(read.statuses, inventory),
            attribution=attribution,
            advertised=dict(plan.counts()),
            allocated=_allocated(plan, assignments),
            processes=read.processes,
            problems=tuple(problems),
        )
        self._latest = snap
        self._refreshed_at = self.monotonic()
        self.updated.set()
        return snap

    def _read_backend(self) -> _BackendRead:
        """Runs in a worker thread: NVML and `/proc` only."""
        problems: list[str] = []
        try:
            statuses = self.backend.statuses()
        except Exception as exc:
            statuses = ()
            problems.append(f"GPU telemetry unavailable: {exc}")
        try:
            processes = self.backend.processes()
        except Exception as exc:
            processes = ()
            problems.append(f"GPU process list unavailable: {exc}")
        identities = cgroup_identities((p.pid for p in processes), self.proc_root)
        return _BackendRead(statuses, processes, identities, tuple(problems))


def _gpu_samples(
    statuses: tuple[GpuStatus, ...], inventory: Inventory | None
) -> tuple[GpuSample, ...]:
    out: list[GpuSample] = []
    for status in statuses:
        gpu = inventory.gpu_by_uuid(status.gpu_uuid) if inventory is not None else None
        if gpu is None:
            total = (status.memory_used_mib or 0) + (status.memory_free_mib or 0)
            out.append(GpuSample(None, status.gpu_uuid, "", total, status))
        else:
            out.append(GpuSample(gpu.index, gpu.uuid, gpu.product_name, gpu.memory_mib, status))
    return tuple(sorted(out, key=lambda s: (s.index is None, s.index or 0, s.uuid)))


def _allocated(plan: Plan, assignments: tuple[ContainerDevices, ...]) -> dict[str, int]:
    held = {(a.resource, d) for a in assignments for d in a.device_ids}
    counts: Counter[str] = Counter()
    for resource in plan.resources:
        counts[resource.name] = sum(1 for d in resource.devices if (resource.name, d.id) in held)
    return dict(counts)
