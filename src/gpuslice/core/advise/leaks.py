"""Which pods grew without bound: they are named, and left out of the sizing.

A leaker's peak says nothing about what it needs, only how long it ran; sizing every
replica for it would waste the GPU for the others, and it would outgrow any share anyway.
The test is "still growing at the end, and all along": the largest value of each quarter
of its life is larger than the one before, by at least `MIN_GROWTH_MIB` or 1 % of its
peak. A model loading then holding, a cache filling up to a cap, a pod bursting to the
same size again and again all flatten out or repeat, so some quarter does not beat the
one before. A pod whose life was too short to fill up before it ended looks like a
leaker too; with fewer than `MIN_SAMPLES` samples none is judged.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAMPLES = 8
MIN_GROWTH_MIB = 64
"""Below this a quarter-to-quarter rise is noise (allocator rounding, a small context)."""


@dataclass(frozen=True, slots=True)
class Leak:
    quarter_peaks_mib: tuple[int, int, int, int]
    rate_mib_per_h: float
    """Growth from the first quarter's peak to the last's, per hour of the time between."""


def find_leak(memory_mib: Sequence[int], step_s: float) -> Leak | None:
    """The leak the series shows, or None (rules in the module docstring)."""
    n = len(memory_mib)
    if n < MIN_SAMPLES:
        return None
    peaks = tuple(max(memory_mib[q * n // 4 : (q + 1) * n // 4]) for q in range(4))
    least = max(MIN_GROWTH_MIB, peaks[3] / 100)
    if not all(b - a >= least for a, b in itertools.pairwise(peaks)):
        return None
    hours = (n * 3 / 4) * step_s / 3600
    return Leak((peaks[0], peaks[1], peaks[2], peaks[3]), (peaks[3] - peaks[0]) / hours)
