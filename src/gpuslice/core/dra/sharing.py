"""A claim's sharing settings: NVIDIA's opaque configs, read as NVIDIA's driver reads them.

A claim written for NVIDIA's DRA driver carries `resource.nvidia.com/v1beta1` `GpuConfig` or
`MigDeviceConfig` in its opaque config (REFERENCE-DRA §5.3). gpuslice accepts them
unchanged and as strictly (an unknown field is an error, naming it), so a claim that works
there works here and a typo is not silently ignored. gpuslice's own additions live under
its own group, `resource.gpuslice.io/v1alpha1` (kind `GuardConfig`: the memory guard's
mode for the claim's devices), so nothing is ever added to NVIDIA's kinds.

Resolution follows NVIDIA's driver (§5.4): from `status.allocation.devices.config`, this
driver's entries only, class configs before claim configs and later before earlier; each
allocation result takes the highest-precedence config that names its request (a
`main/sub` result also matches `main`), else the highest one that names no request; a
config naming a request explicitly must fit the device (no `GpuConfig` on a MIG device).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)

from gpuslice.core.config.problems import problems_from
from gpuslice.core.errors import GpusliceError
from gpuslice.core.sharing.model import NvidiaSharingName, SharingStrategy

Json = dict[str, Any]
NVIDIA_API = "resource.nvidia.com/v1beta1"
GPUSLICE_API = "resource.gpuslice.io/v1alpha1"
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
MIB = 1024 * 1024
PER_DEVICE_LIMITS = 128


class ClaimConfigError(GpusliceError):
    """A claim's config cannot be used; the message names the config entry and field."""


# -- NVIDIA's kinds, field for field -------------------------------------------------------


class _Strict(BaseModel):
    """JSON's field names only (`mpsConfig`, never `mps_config`), as NVIDIA's strict decoder
    reads them: a name it refuses as unknown is refused here too."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _json_number(value: object) -> object:
    """A JSON number, as the API server's admission policy sees it: a string or a boolean is
    not one (pydantic would read "50" and true as numbers; NVIDIA's decoder and CEL do not),
    and a float with no fraction (`50.0`, `5e1`) is the integer the API server makes of it."""
    if isinstance(value, bool | str):
        raise ValueError("must be a number, not a string or a boolean")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _json_quantity(value: object) -> object:
    """A quantity: a string, or a JSON number as `_json_number` reads it."""
    return value if isinstance(value, str) else _json_number(value)


_Int = Annotated[int, BeforeValidator(_json_number)]
_Quantity = Annotated[str | int, BeforeValidator(_json_quantity)]


class _TimeSlicingConfig(_Strict):
    interval: Literal["Default", "Short", "Medium", "Long"] | None = None


class _MpsConfig(_Strict):
    default_active_thread_percentage: _Int | None = Field(
        None, alias="defaultActiveThreadPercentage", ge=0, le=100
    )
    default_pinned_device_memory_limit: _Quantity | None = Field(
        None, alias="defaultPinnedDeviceMemoryLimit"
    )
    default_per_device_pinned_memory_limit: dict[str, _Quantity] | None = Field(
        None, alias="defaultPerDevicePinnedMemoryLimit", max_length=PER_DEVICE_LIMITS
    )
    """At most PER_DEVICE_LIMITS: a key names a device of the config's group (index or UUID;
    NVIDIA's Prepare refuses any other), so no node has more; and the admission policy
    checks them all within the API server's CEL cost limit."""
    multi_user: StrictBool | None = Field(None, alias="multiUser")
    """NVIDIA's `multiUser`: the claim's daemon serves clients of several user IDs
    (`nvidia-cuda-mps-control -d -M`); Volta or newer, checked against the devices."""

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _quantity(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            _mib(v)
        return v

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _quantities(cls, v: dict[str, str | int] | None) -> dict[str, str | int] | None:
        for value in (v or {}).values():
            _mib(value)
        return v


class _GpuSharing(_Strict):
    strategy: NvidiaSharingName
    time_slicing_config: _TimeSlicingConfig | None = Field(None, alias="timeSlicingConfig")
    mps_config: _MpsConfig | None = Field(None, alias="mpsConfig")


class _MigSharing(_Strict):
    strategy: NvidiaSharingName
    mps_config: _MpsConfig | None = Field(None, alias="mpsConfig")


class _GpuConfig(_Strict):
    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: _GpuSharing | None = None


class _MigDeviceConfig(_Strict):
    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: _MigSharing | None = None


class _GuardConfig(_Strict):
    api_version: Literal["resource.gpuslice.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GuardConfig"]
    mode: Literal["off", "observe", "enforce"] | None = None
    shared_by: _Int | None = Field(None, alias="sharedBy", ge=1, le=4096)
    """How many pods are meant to share each device of the claim: each is entitled to
    1/sharedBy of its memory (as `replicas` does for the device plugin). Default 1."""


# -- what the driver acts on ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MpsSettings:
    active_thread_percentage: int | None = None
    pinned_limit_mib: int | None = None
    per_device_limit_mib: Mapping[str, int] = field(default_factory=dict)
    """Key: a device UUID, or an index into the group's devices (as a string)."""
    multi_user: bool = False

    def limit_for(self, uuid: str, index: int) -> int | None:
        for key in (uuid, str(index)):
            if key in self.per_device_limit_mib:
                return self.per_device_limit_mib[key]
        return self.pinned_limit_mib


@dataclass(frozen=True, slots=True)
class Sharing:
    """One resolved config: applied once to the group of devices that share it."""

    kind: Literal["gpu", "mig"]
    strategy: NvidiaSharingName | None = None
    """As the config spelled it (messages quote it); None: no sharing asked (the default
    config): the devices are the claim's alone, shared only by the pods and containers that
    reference the claim. Code asks `shares` instead."""
    interval: int | None = None
    """Time-slice interval (0-3) when the claim asked for one; None: leave the GPU as is."""
    mps: MpsSettings | None = None
    guard_mode: str | None = None
    shared_by: int | None = None
    """GuardConfig `sharedBy`: pods meant to share each device (None: not said, 1)."""
    source: str = "default"
    """Which config entry this came from, for messages (`config[2]` or `default`)."""

    @property
    def shares(self) -> SharingStrategy:
        """`strategy` in the one vocabulary (`NONE` when no sharing was asked)."""
        return SharingStrategy.from_nvidia(self.strategy)


def quantity_mib(value: object) -> int:
    """A Kubernetes quantity (`20Gi`, `21474836480`, an int) in whole MiB, at least 1;
    ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"not a quantity: {value!r}")
    return _mib(value)


QUANTITY_PATTERN = r"[ \t\n\r\f\v]*([0-9]+(?:\.[0-9]+)?)[ \t\n\r\f\v]*([KMGTPE]i?|k|)[ \t\n\r\f\v]*"
"""The quantities `_mib` reads. ASCII only, so the chart's admission policy (RE2, in CEL)
reads the same strings (Python's `\\d` and `\\s` would also match other scripts' digits and
spaces)."""


def _mib(value: str | int) -> int:
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


def parse_opaque(parameters: object, where: str) -> _GpuConfig | _MigDeviceConfig | _GuardConfig:
    """One opaque config's parameters, strictly; errors name `where` and the field."""
    if not isinstance(parameters, Mapping):
        raise ClaimConfigError(f"{where}: parameters must be an object")
    api, kind = parameters.get("apiVersion"), parameters.get("kind")
    models: dict[tuple[object, object], type[_Strict]] = {
        (NVIDIA_API, "GpuConfig"): _GpuConfig,
        (NVIDIA_API, "MigDeviceConfig"): _MigDeviceConfig,
        (GPUSLICE_API, "GuardConfig"): _GuardConfig,
    }
    model = models.get((api, kind))
    if model is None:
        known = ", ".join(f"{a} {k}" for a, k in models)
        raise ClaimConfigError(
            f"{where}: unknown config kind {kind!r} of apiVersion {api!r} (known: {known})"
        )
    try:
        parsed = model.model_validate(dict(parameters))
    except ValidationError as exc:
        problems = "; ".join(str(p) for p in problems_from(model, exc))
        raise ClaimConfigError(f"{where}.parameters: {problems}") from None
    assert isinstance(parsed, _GpuConfig | _MigDeviceConfig | _GuardConfig)
    _check_strategy(parsed, where)
    return parsed


def _check_strategy(cfg: _GpuConfig | _MigDeviceConfig | _GuardConfig, where: str) -> None:
    sharing = getattr(cfg, "sharing", None)
    if sharing is None:
        return
    shares = SharingStrategy.from_nvidia(sharing.strategy)
    if isinstance(sharing, _GpuSharing) and shares is SharingStrategy.MPS:
        if sharing.time_slicing_config is not None:
            raise ClaimConfigError(
                f"{where}.parameters.sharing.timeSlicingConfig: not allowed with strategy MPS"
            )
    elif shares is SharingStrategy.TIME_SLICING and sharing.mps_config is not None:
        raise ClaimConfigError(
            f"{where}.parameters.sharing.mpsConfig: not allowed with strategy TimeSlicing"
        )


def _sharing(
    cfg: _GpuConfig | _MigDeviceConfig, kind: Literal["gpu", "mig"], source: str
) -> Sharing:
    if cfg.sharing is None:
        return Sharing(kind, source=source)
    mps: MpsSettings | None = None
    interval: int | None = None
    mps_cfg = cfg.sharing.mps_config
    if SharingStrategy.from_nvidia(cfg.sharing.strategy) is SharingStrategy.MPS:
        per_device = (mps_cfg.default_per_device_pinned_memory_limit if mps_cfg else None) or {}
        mps = MpsSettings(
            active_thread_percentage=(
                mps_cfg.default_active_thread_percentage if mps_cfg else None
            ),
            pinned_limit_mib=(
                _mib(mps_cfg.default_pinned_device_memory_limit)
                if mps_cfg and mps_cfg.default_pinned_device_memory_limit is not None
                else None
            ),
            per_device_limit_mib={k: _mib(v) for k, v in per_device.items()},
            multi_user=bool(mps_cfg and mps_cfg.multi_user),
        )
    elif isinstance(cfg.sharing, _GpuSharing) and cfg.sharing.time_slicing_config is not None:
        name = cfg.sharing.time_slicing_config.interval
        interval = INTERVALS[name] if name is not None else None
    return Sharing(kind, cfg.sharing.strategy, interval, mps, source=source)


@dataclass(frozen=True, slots=True)
class _Entry:
    requests: tuple[str, ...]
    parsed: _GpuConfig | _MigDeviceConfig | _GuardConfig
    source: str


def resolve(
    allocation: Mapping[str, Any],
    driver: str,
    kind_of: Mapping[str, Literal["gpu", "mig"]],
) -> dict[int, Sharing]:
    """For each of this driver's allocation results (by its index in `results`), the
    sharing it gets. `kind_of` maps device name -> gpu|mig. ClaimConfigError on any config
    of this driver that cannot be used (configs of other drivers are skipped unread)."""
    devices = allocation.get("devices") or {}
    results: Sequence[Json] = devices.get("results") or []
    configs: Sequence[Json] = devices.get("config") or []
    entries: list[_Entry] = []
    for index, entry in enumerate(configs):
        source = entry.get("source")
        if source not in ("FromClass", "FromClaim"):
            raise ClaimConfigError(
                f"config[{index}].source: must be FromClass or FromClaim, got {source!r}"
            )
    ordered = sorted(
        enumerate(configs), key=lambda ic: (0 if ic[1].get("source") == "FromClass" else 1, ic[0])
    )
    for index, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        where = f"config[{index}]"
        parsed = parse_opaque(opaque.get("parameters"), f"{where}.opaque")
        entries.append(_Entry(tuple(entry.get("requests") or ()), parsed, where))
    out: dict[int, Sharing] = {}
    for index, result in enumerate(results):
        if result.get("driver") != driver:
            continue
        device = str(result.get("device", ""))
        kind = kind_of.get(device)
        if kind is None:
            continue  # the caller reports devices it does not know
        request = str(result.get("request", ""))
        names = {request, request.split("/", 1)[0]}
        sharing = Sharing(kind)
        guard: str | None = None
        shared_by: int | None = None
        chosen = _pick(entries, names, kind, _SHARING_KINDS, request)
        if chosen is not None:
            assert not isinstance(chosen.parsed, _GuardConfig)
            sharing = _sharing(chosen.parsed, kind, chosen.source)
        guard_entry = _pick(entries, names, kind, ("GuardConfig",), request)
        if guard_entry is not None and isinstance(guard_entry.parsed, _GuardConfig):
            guard = guard_entry.parsed.mode
            shared_by = guard_entry.parsed.shared_by
        out[index] = Sharing(
            sharing.kind,
            sharing.strategy,
            sharing.interval,
            sharing.mps,
            guard,
            shared_by,
            sharing.source,
        )
    return out


_SHARING_KINDS = ("GpuConfig", "MigDeviceConfig")
_FITS = {"GpuConfig": "gpu", "MigDeviceConfig": "mig"}


def _pick(
    entries: Sequence[_Entry],
    names: set[str],
    kind: str,
    kinds: tuple[str, ...],
    request: str,
) -> _Entry | None:
    """NVIDIA's walk: from the highest precedence down, the first entry that names the
    request, or names no request and fits the device; naming it with a kind that does not
    fit the device is an error."""
    for entry in reversed(entries):
        if entry.parsed.kind not in kinds:
            continue
        wanted = _FITS.get(entry.parsed.kind)
        if names & set(entry.requests):
            if wanted is not None and wanted != kind:
                raise ClaimConfigError(
                    f"{entry.source}: {entry.parsed.kind} names request {request!r}, "
                    f"whose device is a {kind.upper() if kind == 'mig' else 'full GPU'}"
                )
            return entry
        if not entry.requests and (wanted is None or wanted == kind):
            return entry
    return None
