"""Simulated GPU memory that fills up over time, and processes that die when it runs out.

CUDA has no overcommit: `cudaMalloc` fails when the device has no free memory left, and
most frameworks then abort (PyTorch's "CUDA out of memory", TensorFlow's OOM). Under
time-slicing that failure lands on whichever process allocates next, usually a well-behaved
newcomer rather than the process that filled the card. This model reproduces exactly that,
so the guard's benefit is measured instead of asserted.

Pure data and arithmetic over an injected clock value: the simulated backend drives it
with wall-clock time, the benchmark and `gpuslice demo --scenario guard` with simulated
time, `gpuslice advise` with recorded history (`RecordedDemand`). Time advances in steps
of `step_s`; within a step processes allocate in the order they started (a late starter
meets a full card).

**Memory limits per cgroup** (`set_limits`), as NVML's `nvmlDeviceSetMemoryLimits_v1`
documents them: a process allocating past its cgroup's hard limit fails, that process
alone, whatever the free memory (`OomDeath.reason` `hard-limit`); memory under a cgroup's
soft limit is "guaranteed before allocations may fail due to memory pressure", which the
model reads as memory held back for that cgroup: nobody else can allocate into the part of
another cgroup's soft limit it does not use yet. NVIDIA does not say how the driver keeps
that guarantee (holding memory back, or taking it from a borrower); holding it back is the
reading that needs no reclaim, and it cannot give back memory a borrower already held when
the limit was set (a late cgroup then finds less than its soft limit). Clearing (soft 0,
hard max) or removing the cgroup (`clear_limits`) lifts both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Demand(Protocol):
    """What the model asks of a process: how much memory it wants at an age. A formula
    (`Allocation`) for synthetic load, a recording (`RecordedDemand`) for a replay."""

    def wanted_mib(self, age_s: float) -> int: ...


@dataclass(frozen=True, slots=True)
class Allocation:
    """How much memory a process wants as it ages."""

    start_mib: int = 0
    """Allocated at once when the process starts (its model weights, a CUDA context)."""
    rate_mib_s: float = 0.0
    """Growth after that (a cache filling, a leak)."""
    target_mib: int | None = None
    """Where growth stops; None grows for ever (a leak)."""
    burst_mib: int = 0
    """Extra memory held for `burst_s` every `burst_every_s` (a large batch, a compile)."""
    burst_every_s: float = 0.0
    burst_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("start_mib", "rate_mib_s", "burst_mib", "burst_every_s", "burst_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.target_mib is not None and self.target_mib < self.start_mib:
            raise ValueError(
                f"target_mib: must be >= start_mib ({self.start_mib}), got {self.target_mib}"
            )

    def wanted_mib(self, age_s: float) -> int:
        base = self.start_mib + self.rate_mib_s * max(0.0, age_s)
        if self.target_mib is not None:
            base = min(base, float(self.target_mib))
        bursting = (
            self.burst_every_s > 0
            and age_s >= self.burst_every_s
            and age_s % self.burst_every_s < self.burst_s
        )
        return math.ceil(base) + (self.burst_mib if bursting else 0)


@dataclass(frozen=True, slots=True)
class RecordedDemand:
    """A pod's memory as it was scraped, one value per `step_s` from its start: replaying
    it asks the model for exactly what the pod used, when it used it. Past the recording
    it wants nothing more than its last value."""

    mib: Sequence[int]
    step_s: float

    def wanted_mib(self, age_s: float) -> int:
        mib = self.mib
        if not mib:
            return 0
        index = int(age_s / self.step_s + 1e-9)
        if index >= len(mib):
            return mib[-1]
        return mib[index] if index >= 0 else mib[0]


@dataclass(frozen=True, slots=True)
class OomDeath:
    pid: int
    at: float
    wanted_mib: int
    """What it tried to hold when the allocation failed."""
    free_mib: int
    """Free memory on the GPU at that moment."""
    reason: str = "out-of-memory"
    """`out-of-memory` (the card, or the part not held back for others, was full) or
    `hard-limit` (its own cgroup's hard limit)."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """A cgroup's memory limits on this GPU, in MiB (`None` hard: no hard limit)."""

    soft_mib: int = 0
    hard_mib: int | None = None


@dataclass(slots=True)
class _Proc:
    allocation: Demand
    started_at: float
    used_mib: int = 0
    group: str | None = None


@dataclass(slots=True)
class GpuMemoryModel:
    """One GPU's memory: growing processes plus memory held by others (`fixed_mib`)."""

    total_mib: int
    step_s: float = 0.05
    fixed_mib: int = 0
    """Held by processes this model does not grow (fixed-size simulated processes)."""
    fixed_groups: dict[str, int] = field(default_factory=dict)
    """cgroup -> the part of `fixed_mib` its processes hold: a cgroup's usage, and what its
    soft limit still holds back, count fixed memory too (the simulator's control directory
    puts a fixed process in a cgroup)."""
    now: float | None = None
    procs: dict[int, _Proc] = field(default_factory=dict)
    deaths: list[OomDeath] = field(default_factory=list)
    _procs_mib: int = field(default=0, init=False, repr=False)
    """Sum of `procs`' usage, kept as they change: a replay of a week asks for the free
    memory millions of times."""
    _order: list[int] | None = field(default=None, init=False, repr=False)
    """`procs` in allocation order, until a process starts or ends."""
    limits: dict[str, GroupLimits] = field(default_factory=dict)
    """cgroup -> its limits on this GPU (`set_limits`); empty: no limits, the fast path."""

    def set_limits(self, group: str, soft_mib: int, hard_mib: int | None) -> None:
        """Set (or replace) a cgroup's limits; soft 0 and no hard limit clears them."""
        if soft_mib < 0 or (hard_mib is not None and hard_mib < 0):
            raise ValueError(f"negative memory limits for {group}: {soft_mib}, {hard_mib}")
        if soft_mib == 0 and hard_mib is None:
            self.limits.pop(group, None)
        else:
            self.limits[group] = GroupLimits(soft_mib, hard_mib)

    def clear_limits(self, group: str) -> None:
        """The cgroup was removed (or its limits cleared)."""
        self.limits.pop(group, None)

    def group_used_mib(self, group: str) -> int:
        grown = sum(p.used_mib for p in self.procs.values() if p.group == group)
        return grown + self.fixed_groups.get(group, 0)

    def held_back_mib(self, besides: str | None = None) -> int:
        """Memory held for cgroups below their soft limit, other than `besides`."""
        if not self.limits:
            return 0
        used: dict[str, int] = dict(self.fixed_groups)
        for p in self.procs.values():
            if p.group is not None:
                used[p.group] = used.get(p.group, 0) + p.used_mib
        return sum(
            max(0, lim.soft_mib - used.get(g, 0)) for g, lim in self.limits.items() if g != besides
        )

    @property
    def used_mib(self) -> int:
        return self.fixed_mib + self._procs_mib

    @property
    def free_mib(self) -> int:
        return max(0, self.total_mib - self.used_mib)

    def start(
        self, pid: int, allocation: Demand, now: float, group: str | None = None
    ) -> OomDeath | None:
        """A process starts (in cgroup `group`, for the limits): its initial allocation
        succeeds, or it dies at once."""
        self.advance(now)
        self.stop(pid)
        self.procs[pid] = _Proc(allocation, now, group=group)
        self._order = None
        return self._allocate(pid, now)

    def stop(self, pid: int) -> None:
        """The process exited (or was killed): its memory is free again."""
        proc = self.procs.pop(pid, None)
        if proc is not None:
            self._procs_mib -= proc.used_mib
            self._order = None

    def usage(self, pid: int) -> int | None:
        proc = self.procs.get(pid)
        return None if proc is None else proc.used_mib

    def advance(self, now: float) -> list[OomDeath]:
        """Run time forward to `now`; returns the processes that died of OOM meanwhile."""
        if self.now is None or now <= self.now:
            self.now = now if self.now is None else max(self.now, now)
            return []
        died: list[OomDeath] = []
        t = self.now
        while t < now:
            t = min(now, t + self.step_s)
            if self._order is None:
                self._order = sorted(self.procs, key=lambda p: (self.procs[p].started_at, p))
            for pid in self._order.copy():
                death = self._allocate(pid, t)
                if death is not None:
                    died.append(death)
        self.now = now
        return died

    def _allocate(self, pid: int, t: float) -> OomDeath | None:
        proc = self.procs[pid]
        wanted = proc.allocation.wanted_mib(t - proc.started_at)
        delta = wanted - proc.used_mib
        if delta <= 0:
            proc.used_mib = wanted
            self._procs_mib += delta
            return None
        free = self.free_mib
        reason = "out-of-memory"
        if self.limits:
            lim = self.limits.get(proc.group) if proc.group is not None else None
            if (
                lim is not None
                and lim.hard_mib is not None
                and self.group_used_mib(proc.group or "") + delta > lim.hard_mib
            ):
                free, reason = 0, "hard-limit"
            if reason == "out-of-memory":
                free = max(0, free - self.held_back_mib(besides=proc.group))
        if delta > free:
            self.stop(pid)
            death = OomDeath(pid, t, wanted, self.free_mib, reason)
            self.deaths.append(death)
            return death
        proc.used_mib = wanted
        self._procs_mib += delta
        return None
