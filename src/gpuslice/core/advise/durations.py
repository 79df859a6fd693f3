"""Durations as Prometheus writes them (`90s`, `15m`, `24h`, `7d`, `1w`), so a range that
works in a PromQL query works on the command line too."""

from __future__ import annotations

import math
import re

from gpuslice.core.errors import GpusliceError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in `text` (`1h30m` too); a bare number is seconds. `inf`, `nan` and
    `1e400` parse as floats but size nothing: refused here, so a grid is never built on
    them."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _PART.finditer(value):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _SECONDS[m.group(2)]
            pos = m.end()
        if pos != len(value) or not value:
            raise GpusliceError(
                f"{what}: expected a duration such as 90s, 15m, 24h or 7d, got {text!r}"
            ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise GpusliceError(f"{what}: must be positive and finite, got {text!r}")
    return seconds
