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


@dataclass(slots=True)
class _Proc:
    allocation: Demand
    started_at: float
    used_mib: int = 0


@dataclass(slots=True)
class GpuMemoryModel:
    """One GPU's memory: growing processes plus memory held by others (`fixed_mib`)."""

    total_mib: int
    step_s: float = 0.05
    fixed_mib: int = 0
    """Held by processes this model does not grow (fixed-size simulated processes)."""
    now: float | None = None
    procs: dict[int, _Proc] = field(default_factory=dict)
    deaths: list[OomDeath] = field(default_factory=list)
    _procs_mib: int = field(default=0, init=False, repr=False)
    """Sum of `procs`' usage, kept as they change: a replay of a week asks for the free
    memory millions of times."""
    _order: list[int] | None = field(default=None, init=False, repr=False)
    """`procs` in allocation order, until a process starts or ends."""

    @property
    def used_mib(self) -> int:
        return self.fixed_mib + self._procs_mib

    @property
    def free_mib(self) -> int:
        return max(0, self.total_mib - self.used_mib)

    def start(self, pid: int, allocation: Demand, now: float) -> OomDeath | None:
        """A process starts: its initial allocation succeeds, or it dies at once."""
        self.advance(now)
        self.stop(pid)
        self.procs[pid] = _Proc(allocation, now)
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
        if delta > free:
            self.stop(pid)
            death = OomDeath(pid, t, wanted, free)
            self.deaths.append(death)
            return death
        proc.used_mib = wanted
        self._procs_mib += delta
        return None
