"""Sizes and Kubernetes quantities: one vocabulary for the whole package.

`MIB` is the one mebibyte; `Quantity` is the API's `resource.Quantity` (exact, with its
canonical spelling, which a published ResourceSlice must use or every comparison with the
stored one differs); `quantity_mib` reads the sizes NVIDIA's opaque configs carry, in the
narrower grammar the chart's admission policy checks (RE2 in CEL), rounding down as NVIDIA
does. Every suffix table is here, so the three readings cannot drift apart.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MIB = 1024 * 1024


def whole_mib(size: int) -> int:
    """`size` bytes rounded down to whole MiB: the grain of the memory limits the toolkit's
    hook sets (its variables are in MiB), so limits the agent wants in bytes are the very
    ones a hook-capped container's cgroup reads back."""
    return size - size % MIB if size > 0 else size


BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
SMALL_SUFFIXES = {"m": Fraction(1, 10**3), "u": Fraction(1, 10**6), "n": Fraction(1, 10**9)}
_BINARY_DESC = tuple(reversed(BINARY_SUFFIXES.items()))
_DECIMAL_DESC = tuple(reversed(DECIMAL_SUFFIXES.items()))

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)


class Quantity:
    """A `resource.Quantity`: an exact value, and whether it was written with a binary
    suffix (which decides how it is written back, as the API's canonical form does)."""

    __slots__ = ("binary", "value")

    def __init__(self, value: Fraction | int, binary: bool = False) -> None:
        self.value = Fraction(value)
        self.binary = binary

    @classmethod
    def parse(cls, text: object) -> Quantity:
        if isinstance(text, Quantity):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            return cls(text)
        if not isinstance(text, str):
            raise ValueError(f"not a quantity: {text!r}")
        m = _QUANTITY.match(text.strip())
        if m is None:
            raise ValueError(f"not a quantity: {text!r}")
        number, suffix = Fraction(m.group(1)), m.group(2) or ""
        if suffix in BINARY_SUFFIXES:
            return cls(number * BINARY_SUFFIXES[suffix], binary=True)
        if suffix in DECIMAL_SUFFIXES:
            return cls(number * DECIMAL_SUFFIXES[suffix])
        if suffix in SMALL_SUFFIXES:
            return cls(number * SMALL_SUFFIXES[suffix])
        if suffix:
            return cls(number * Fraction(10) ** int(suffix[1:]))
        return cls(number)

    def __str__(self) -> str:
        """Canonical form: the largest suffix that keeps the value exact (binary suffixes for
        a binary quantity, decimal ones otherwise); fractions in m/u/n, rounded up to 1n as
        the API does."""
        v = self.value
        if v.denominator == 1:
            return _canonical_int(int(v), self.binary)
        for suffix, div in (("m", 10**3), ("u", 10**6), ("n", 10**9)):
            scaled = v * div
            if scaled.denominator == 1:
                return f"{scaled.numerator}{suffix}"
        return f"{math.ceil(v * 10**9)}n"

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def _other(self, other: object) -> Fraction:
        if not isinstance(other, Quantity):
            raise TypeError(f"no such overload: quantity and {type(other).__name__}")
        return other.value

    def __eq__(self, other: object) -> bool:
        return self.value == self._other(other)

    def __ne__(self, other: object) -> bool:
        return self.value != self._other(other)

    def __lt__(self, other: object) -> bool:
        return self.value < self._other(other)

    def __le__(self, other: object) -> bool:
        return self.value <= self._other(other)

    def __gt__(self, other: object) -> bool:
        return self.value > self._other(other)

    def __ge__(self, other: object) -> bool:
        return self.value >= self._other(other)

    def __hash__(self) -> int:
        return hash(self.value)


def canonical_quantity(value: int, *, binary: bool = False) -> str:
    """`value` in the canonical form the API server returns a Quantity in (`5Gi`, not
    `5120Mi`; `1k`, not `1000`). Publishing any other spelling makes every comparison with
    the stored slice differ, and the pool would be republished at each resync."""
    return _canonical_int(value, binary)


def _canonical_int(n: int, binary: bool) -> str:
    """A whole quantity's canonical spelling: the largest suffix that divides it. Kept off
    `Fraction`: a slice publish spells about 450 capacities and attributes per resync."""
    for suffix, mult in _BINARY_DESC if binary else _DECIMAL_DESC:
        if n and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


_MIB_SCALES: dict[str, int] = {"": 1, "K": 10**3, **DECIMAL_SUFFIXES, **BINARY_SUFFIXES}
"""The suffixes `QUANTITY_PATTERN` admits (`K` as well as `k`, as NVIDIA's configs do)."""


def quantity_mib(value: object) -> int:
    """A Kubernetes quantity (`20Gi`, `21474836480`, an int) in whole MiB, at least 1;
    ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"not a quantity: {value!r}")
    return mib_of(value)


QUANTITY_PATTERN = r"[ \t\n\r\f\v]*([0-9]+(?:\.[0-9]+)?)[ \t\n\r\f\v]*([KMGTPE]i?|k|)[ \t\n\r\f\v]*"
"""The quantities `mib_of` reads. ASCII only, so the chart's admission policy (RE2, in CEL)
reads the same strings (Python's `\\d` and `\\s` would also match other scripts' digits and
spaces)."""


def mib_of(value: str | int) -> int:
    """A Kubernetes quantity in whole MiB (NVIDIA rounds down; at least 1 MiB). A value too
    large for a float (hundreds of digits) is refused, not an OverflowError."""
    if isinstance(value, int):
        count = value
    else:
        m = re.fullmatch(QUANTITY_PATTERN, value)
        if m is None:
            raise ValueError(f"not a quantity: {value!r}")
        scale = _MIB_SCALES[m.group(2)]
        scaled = float(m.group(1)) * scale
        if not math.isfinite(scaled):
            raise ValueError("too large")
        count = int(scaled)
    mib = count // MIB
    if mib < 1:
        raise ValueError(f"must be at least 1Mi, got {value!r}")
    return mib
