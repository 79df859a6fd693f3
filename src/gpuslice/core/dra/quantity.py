"""Kubernetes quantities in claims' opaque configs, read as NVIDIA's driver reads them.

Its own module so the opaque config kinds (`core.dra.opaque`) and the claim-side readers
share one reader, below all of them."""

from __future__ import annotations

import math
import re

MIB = 1024 * 1024


def quantity_mib(value: object) -> int:
    """A Kubernetes quantity (`20Gi`, `21474836480`, an int) in whole MiB, at least 1;
    ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"not a quantity: {value!r}")
    return mib(value)


QUANTITY_PATTERN = r"[ \t\n\r\f\v]*([0-9]+(?:\.[0-9]+)?)[ \t\n\r\f\v]*([KMGTPE]i?|k|)[ \t\n\r\f\v]*"
"""The quantities `mib` reads. ASCII only, so the chart's admission policy (RE2, in CEL)
reads the same strings (Python's `\\d` and `\\s` would also match other scripts' digits and
spaces)."""


def mib(value: str | int) -> int:
    """A Kubernetes quantity in whole MiB (NVIDIA rounds down; at least 1 MiB). A value too
    large for a float (hundreds of digits) is refused, not an OverflowError."""
    if isinstance(value, int):
        count = value
    else:
        m = re.fullmatch(QUANTITY_PATTERN, value)
        if m is None:
            raise ValueError(f"not a quantity: {value!r}")
        scale = {
            "": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
            "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
            "Ei": 2**60,
        }[m.group(2)]  # fmt: skip
        scaled = float(m.group(1)) * scale
        if not math.isfinite(scaled):
            raise ValueError("too large")
        count = int(scaled)
    mib = count // MIB
    if mib < 1:
        raise ValueError(f"must be at least 1Mi, got {value!r}")
    return mib
