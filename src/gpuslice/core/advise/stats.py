"""Per pod: what it used of its GPU, in the few numbers a sizing decision needs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.core.advise.history import PodTrace
from gpuslice.core.advise.leaks import Leak, find_leak


@dataclass(frozen=True, slots=True)
class PodStats:
    trace: PodTrace
    peak_mib: int
    p99_mib: int
    mean_sm_percent: float | None
    """Over its whole recorded life, idle time included; None without SM samples (MIG)."""
    active_s: float
    """Time it used the GPU: SM use above zero, or (without SM samples) memory held."""
    lifetime_s: float
    leak: Leak | None

    @property
    def name(self) -> str:
        return self.trace.name

    @property
    def idle(self) -> bool:
        """Never used the GPU: no memory and no SM time in the whole range."""
        return self.peak_mib == 0 and self.active_s == 0

    @property
    def sized(self) -> bool:
        """Counts in the sizing: neither idle nor leaking."""
        return not self.idle and self.leak is None


def percentile(values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile: a value that was actually seen, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def pod_stats(trace: PodTrace, step_s: float) -> PodStats:
    memory = trace.memory_mib
    sm = trace.sm_percent
    if sm is not None:
        active = sum(1 for v in sm if v > 0)
        mean_sm: float | None = sum(sm) / len(sm)
    else:
        active = sum(1 for v in memory if v > 0)
        mean_sm = None
    return PodStats(
        trace=trace,
        peak_mib=max(memory),
        p99_mib=percentile(memory, 99),
        mean_sm_percent=mean_sm,
        active_s=active * step_s,
        lifetime_s=len(memory) * step_s,
        leak=find_leak(memory, step_s),
    )
