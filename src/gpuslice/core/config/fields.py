"""Value types of the config file that need more than a pydantic built-in.

Each parser accepts what NVIDIA's Go types accept (so existing files keep loading) and
rejects the rest with a message that names the bad value and what would be accepted,
because these messages end up verbatim in pod logs and Kubernetes Events.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Literal

from pydantic_core import PydanticCustomError

RESOURCE_DOMAIN = "nvidia.com"
MAX_RESOURCE_NAME_LENGTH = 63
"""Kubernetes' limit for a qualified name; NVIDIA checks the whole `nvidia.com/<name>`."""

SHARED_SUFFIX = ".shared"
"""NVIDIA's `DefaultSharedResourceNameSuffix`, appended when `renameByDefault` is true."""

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

DeviceSelection = Literal["all"] | int | tuple[str, ...]
"""`devices` of a sharing entry: every device, the first N, or an explicit list of refs
(GPU index `"0"`, MIG index `"0:1"`, `GPU-<uuid>`, `MIG-<uuid>`, `MIG-GPU-<uuid>/<gi>/<ci>`)."""


def config_error(message: str, subpath: str = "") -> PydanticCustomError:
    """A validation error whose text is shown to the user as is.

    `subpath` (e.g. `resources[2]`) refines where the problem is when a model-level check
    finds it inside one of the model's fields; the translator appends it to the location.
    """
    return PydanticCustomError("gpuslice", "{message}", {"message": message, "subpath": subpath})


def show(value: object) -> str:
    """A value as the user wrote it in YAML, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return str(value)


# --- resource names -------------------------------------------------------------------


def resource_name(value: str) -> str:
    """`gpu` -> `nvidia.com/gpu`, then NVIDIA's length and DNS-subdomain checks."""
    prefix = RESOURCE_DOMAIN + "/"
    full = value if value.startswith(prefix) else prefix + value
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        raise config_error(
            f"fully-qualified resource name must be {MAX_RESOURCE_NAME_LENGTH} characters "
            f"or less: {full} ({len(full)} characters)"
        )
    short = full[len(prefix) :]
    if len(short) > 253 or not _DNS_SUBDOMAIN.fullmatch(short):
        raise config_error(
            f"incorrect format for resource name '{full}': the part after '{prefix}' must be "
            "a lowercase RFC 1123 subdomain: lowercase letters, digits, '-' and '.', starting "
            "and ending with a letter or digit (e.g. 'gpu', 'gpu.shared', 'mig-1g.10gb')"
        )
    return full


# --- device selections ----------------------------------------------------------------

_DEVICES_EXPECTED = (
    "expected 'all', a count > 0, or a list of GPU indices (0), MIG indices ('0:1'), "
    "GPU UUIDs ('GPU-...') or MIG UUIDs ('MIG-...')"
)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def is_gpu_index(ref: str) -> bool:
    return ref.isascii() and ref.isdigit()


def is_mig_index(ref: str) -> bool:
    parts = ref.split(":")
    return len(parts) == 2 and all(is_gpu_index(p) for p in parts)


def is_gpu_uuid(ref: str) -> bool:
    return ref.startswith("GPU-") and _is_uuid(ref[4:])


def is_mig_uuid(ref: str) -> bool:
    """`MIG-<uuid>` (R470+) or the older `MIG-GPU-<uuid>/<gi>/<ci>`."""
    if not ref.startswith("MIG-"):
        return False
    rest = ref[4:]
    if _is_uuid(rest):
        return True
    parts = rest.split("/")
    return len(parts) == 3 and is_gpu_uuid(parts[0]) and all(is_gpu_index(p) for p in parts[1:])


def _device_ref(item: object) -> str | None:
    if isinstance(item, int) and not isinstance(item, bool):
        return str(item) if item >= 0 else None
    if isinstance(item, str):
        ref = item.strip()
        if is_gpu_index(ref) or is_mig_index(ref) or is_gpu_uuid(ref) or is_mig_uuid(ref):
            return ref
    return None


def device_selection(value: object) -> DeviceSelection:
    """Parse `devices` the way NVIDIA's `ReplicaDevices` does, with its error texts."""
    if isinstance(value, bool):
        raise config_error(
            f"unrecognized type for devices spec: {show(value)}; {_DEVICES_EXPECTED}"
        )
    if isinstance(value, str):
        if value == "all":
            return "all"
        raise config_error(
            f"devices set as '{value}' but the only valid string input is 'all' "
            "(or give a count, or a list of devices)"
        )
    if isinstance(value, int):
        if value <= 0:
            raise config_error(f"devices set as '{value}' but a count of devices must be > 0")
        return value
    if isinstance(value, list | tuple):
        if not value:
            raise config_error(
                f"devices is an empty list, which selects nothing; {_DEVICES_EXPECTED}"
            )
        refs: list[str] = []
        bad: list[str] = []
        for i, item in enumerate(value):
            ref = _device_ref(item)
            if ref is None:
                bad.append(f"[{i}] {show(item)}")
            elif ref not in refs:
                refs.append(ref)
        if bad:
            raise config_error(
                f"unsupported device in devices list: {', '.join(bad)}; {_DEVICES_EXPECTED}"
            )
        return tuple(refs)
    raise config_error(f"unrecognized type for devices spec: {show(value)}; {_DEVICES_EXPECTED}")


def describe_selection(selection: DeviceSelection) -> str:
    if isinstance(selection, tuple):
        return f"[{', '.join(selection)}]"
    if isinstance(selection, int):
        return f"the first {selection}"
    return "all"


def selections_overlap(a: DeviceSelection, b: DeviceSelection) -> bool:
    """Whether two selections certainly share a device, judged without the inventory.

    A count selects the first N devices, so it overlaps another count and any GPU index
    below N. UUIDs and MIG indices against a count can only be judged on the node; the plan
    checks those.
    """
    if a == "all" or b == "all":
        return True
    if isinstance(a, int) and isinstance(b, int):
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return bool(set(a) & set(b))
    if isinstance(a, int) and isinstance(b, tuple):
        return any(is_gpu_index(r) and int(r) < a for r in b)
    if isinstance(b, int) and isinstance(a, tuple):
        return any(is_gpu_index(r) and int(r) < b for r in a)
    return False


# --- durations ------------------------------------------------------------------------

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
INFINITE = "infinite"
_DURATION_EXPECTED = (
    "expected a duration such as '60s', '1m30s' or '500ms', a number of nanoseconds, "
    f"or '{INFINITE}'"
)


def _parse_go_duration(text: str) -> int | None:
    """Go's `time.ParseDuration`, in nanoseconds; None when the text is not a duration."""
    s = text.strip()
    sign = 1
    if s[:1] in "+-" and s:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            return None
        total += float(m.group(1)) * _NS_PER_UNIT[m.group(2)]
        pos = m.end()
    return sign * round(total)


def sleep_interval(value: object) -> float:
    """GFD's `sleepInterval` in seconds (`math.inf` for `infinite`)."""
    if isinstance(value, float | int) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise config_error(f"invalid duration {show(value)}; {_DURATION_EXPECTED}")
        ns = int(value)
        if ns != value:
            raise config_error(
                f"{show(value)} is not a whole number of nanoseconds; {_DURATION_EXPECTED}"
            )
    elif isinstance(value, str):
        if value.strip() == INFINITE:
            return math.inf
        parsed = _parse_go_duration(value)
        if parsed is None:
            raise config_error(f"invalid duration {show(value)}; {_DURATION_EXPECTED}")
        ns = parsed
    else:
        raise config_error(f"invalid duration {show(value)}; {_DURATION_EXPECTED}")
    if ns <= 0:
        raise config_error(f"sleep interval must be > 0, got {show(value)}")
    return ns / 1e9


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def format_go_duration(seconds: float) -> str:
    """What Go's `Duration.String()` prints (`1m0s` for 60 s), so dumps match NVIDIA's."""
    if math.isinf(seconds):
        return INFINITE
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _decimal(ns, size) + unit
    hours, rest = divmod(ns, _NS_PER_UNIT["h"])
    minutes, rest = divmod(rest, _NS_PER_UNIT["m"])
    text = _decimal(rest, 1_000_000_000) + "s"
    if hours:
        text = f"{hours}h{minutes}m{text}"
    elif minutes:
        text = f"{minutes}m{text}"
    return sign + text
