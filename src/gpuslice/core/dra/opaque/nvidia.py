"""What NVIDIA's two sharing kinds (`GpuConfig`, `MigDeviceConfig`) have in common, field
for field with `resource.nvidia.com/v1beta1` (REFERENCE-DRA §5.3): the MPS and
time-slicing blocks, and how a `sharing` block becomes the device's `Sharing`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, field_validator

from gpuslice.core.dra.opaque.base import (
    INTERVALS,
    Admission,
    ClaimConfigError,
    JsonInt,
    JsonQuantity,
    MpsSettings,
    Rule,
    SharingSlot,
    StrictModel,
)
from gpuslice.core.sharing.model import NvidiaSharingName, SharingStrategy
from gpuslice.core.units import mib_of as mib

NVIDIA_API = "resource.nvidia.com/v1beta1"
PER_DEVICE_LIMITS = 128


class TimeSlicingConfig(StrictModel):
    interval: Literal["Default", "Short", "Medium", "Long"] | None = None


class MpsConfig(StrictModel):
    default_active_thread_percentage: JsonInt | None = Field(
        None, alias="defaultActiveThreadPercentage", ge=0, le=100
    )
    default_pinned_device_memory_limit: JsonQuantity | None = Field(
        None, alias="defaultPinnedDeviceMemoryLimit"
    )
    default_per_device_pinned_memory_limit: dict[str, JsonQuantity] | None = Field(
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
            mib(v)
        return v

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _quantities(cls, v: dict[str, str | int] | None) -> dict[str, str | int] | None:
        for value in (v or {}).values():
            mib(value)
        return v


class GpuSharing(StrictModel):
    strategy: NvidiaSharingName
    time_slicing_config: TimeSlicingConfig | None = Field(None, alias="timeSlicingConfig")
    mps_config: MpsConfig | None = Field(None, alias="mpsConfig")


class MigSharing(StrictModel):
    """A MIG device's: no time-slice interval (it is GPU-wide)."""

    strategy: NvidiaSharingName
    mps_config: MpsConfig | None = Field(None, alias="mpsConfig")


def check_sharing(sharing: GpuSharing | MigSharing | None, where: str) -> None:
    """The strategy's own block only, as NVIDIA's validation has it."""
    if sharing is None:
        return
    shares = SharingStrategy.from_nvidia(sharing.strategy)
    if isinstance(sharing, GpuSharing) and shares is SharingStrategy.MPS:
        if sharing.time_slicing_config is not None:
            raise ClaimConfigError(
                f"{where}.parameters.sharing.timeSlicingConfig: not allowed with strategy MPS"
            )
    elif shares is SharingStrategy.TIME_SLICING and sharing.mps_config is not None:
        raise ClaimConfigError(
            f"{where}.parameters.sharing.mpsConfig: not allowed with strategy TimeSlicing"
        )


def contribute_sharing(sharing: GpuSharing | MigSharing | None, source: str) -> SharingSlot:
    """The devices shared as the block says (no block: not shared, the config's own devices)."""
    if sharing is None:
        return SharingSlot(source=source)
    mps: MpsSettings | None = None
    interval: int | None = None
    mps_cfg = sharing.mps_config
    shares = SharingStrategy.from_nvidia(sharing.strategy)
    if shares is SharingStrategy.MPS:
        per_device = (mps_cfg.default_per_device_pinned_memory_limit if mps_cfg else None) or {}
        mps = MpsSettings(
            active_thread_percentage=(
                mps_cfg.default_active_thread_percentage if mps_cfg else None
            ),
            pinned_limit_mib=(
                mib(mps_cfg.default_pinned_device_memory_limit)
                if mps_cfg and mps_cfg.default_pinned_device_memory_limit is not None
                else None
            ),
            per_device_limit_mib={k: mib(v) for k, v in per_device.items()},
            multi_user=bool(mps_cfg and mps_cfg.multi_user),
        )
    elif isinstance(sharing, GpuSharing) and sharing.time_slicing_config is not None:
        name = sharing.time_slicing_config.interval
        interval = INTERVALS[name] if name is not None else None
    return SharingSlot(strategy=shares, interval=interval, mps=mps, source=source)


# -- the same checks at admission (the chart's policy, generated from the registry) ----------


def _quantity(value: str) -> str:
    """CEL: `value` is a memory limit as `units.mib_of` reads it: a whole number of bytes of
    at least 1Mi (a number the API server could not make an int64 is at least 2^63), or a
    string <number><suffix> (`variables.quantityPattern`) of at least 1Mi, finite."""
    return (
        f"[{value}].all(q, type(q) == int ? q >= 1048576 : "
        "type(q) == double ? q >= 9223372036854775808.0 : "
        "type(q) == string && q.matches(variables.quantityPattern) && "
        "[double(q.find('[0-9]+([.][0-9]+)?')) * variables.scale[q.find('[KMGTPEk]i?')]]"
        ".all(v, v >= 1048576.0 && v <= 1.7976931348623157e308))"
    )


_AT = "variables.at + '.config[].opaque.parameters"

ADMISSION = Admission(
    name="NVIDIA's sharing block (GpuConfig, MigDeviceConfig)",
    covers=frozenset({"sharing"}),
    variables=(
        # a field set to null is a field not set (as Prepare reads it)
        (
            "gpuSharing",
            "variables.known.filter(p, p.kind == 'GpuConfig' && 'sharing' in p && "
            "p.sharing != null).map(p, p.sharing)",
        ),
        (
            "migSharing",
            "variables.known.filter(p, p.kind == 'MigDeviceConfig' && 'sharing' in p && "
            "p.sharing != null).map(p, p.sharing)",
        ),
        ("sharing", "(variables.gpuSharing + variables.migSharing).filter(s, type(s) == map)"),
        (
            "timeSlicing",
            "variables.gpuSharing.filter(s, type(s) == map && 'timeSlicingConfig' in s && "
            "s.timeSlicingConfig != null).map(s, s.timeSlicingConfig)",
        ),
        (
            "mps",
            "variables.sharing.filter(s, 'mpsConfig' in s && s.mpsConfig != null)"
            ".map(s, s.mpsConfig)",
        ),
        ("mpsMaps", "variables.mps.filter(m, type(m) == map)"),
        (
            "quantityPattern",
            r"'^[ \t\n\r\f\v]*[0-9]+([.][0-9]+)?[ \t\n\r\f\v]*([KMGTPE]i?|k)?[ \t\n\r\f\v]*$'",
        ),
        (
            "scale",
            "{'': 1.0, 'k': 1e3, 'K': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12, 'P': 1e15, "
            "'E': 1e18, 'Ki': 1024.0, 'Mi': 1048576.0, 'Gi': 1073741824.0, "
            "'Ti': 1099511627776.0, 'Pi': 1125899906842624.0, 'Ei': 1152921504606846976.0}",
        ),
    ),
    rules=(
        Rule(
            "(variables.gpuSharing + variables.migSharing).all(s, type(s) == map) && "
            "variables.gpuSharing.all(s, s.all(k, k in ['strategy', 'timeSlicingConfig', "
            "'mpsConfig'])) && "
            "variables.migSharing.all(s, s.all(k, k in ['strategy', 'mpsConfig']))",
            f"{_AT}.sharing: must be an object with strategy and mpsConfig (GpuConfig: also "
            "timeSlicingConfig), no other field'",
        ),
        Rule(
            "variables.sharing.all(s, 'strategy' in s && s.strategy in ['TimeSlicing', 'MPS'])",
            f"{_AT}.sharing.strategy: required, TimeSlicing or MPS; got ' + "
            "variables.sharing.filter(s, !('strategy' in s && s.strategy in ['TimeSlicing', "
            "'MPS'])).map(s, 'strategy' in s ? string(s.strategy) : '(none)').join(', ')",
            "spec.devices.config[].opaque.parameters.sharing.strategy: required, TimeSlicing "
            "or MPS",
        ),
        Rule(
            "variables.sharing.all(s, !('strategy' in s && s.strategy == 'TimeSlicing' && "
            "'mpsConfig' in s && s.mpsConfig != null)) && "
            "variables.sharing.all(s, !('strategy' in s && s.strategy == 'MPS' && "
            "'timeSlicingConfig' in s && s.timeSlicingConfig != null))",
            f"{_AT}.sharing: mpsConfig is not allowed with strategy TimeSlicing, nor "
            "timeSlicingConfig with strategy MPS'",
        ),
        Rule(
            "variables.timeSlicing.all(t, type(t) == map && t.all(k, k == 'interval') && "
            "(!('interval' in t) || t.interval == null || t.interval in ['Default', 'Short', "
            "'Medium', 'Long']))",
            f"{_AT}.sharing.timeSlicingConfig: only interval, one of Default, Short, Medium, "
            "Long; got ' + variables.timeSlicing.filter(t, type(t) == map && 'interval' in t "
            "&& t.interval != null).map(t, string(t.interval)).join(', ')",
            "spec.devices.config[].opaque.parameters.sharing.timeSlicingConfig: only "
            "interval, one of Default, Short, Medium, Long",
        ),
        Rule(
            "variables.mps.all(m, type(m) == map && m.all(k, k in "
            "['defaultActiveThreadPercentage', 'defaultPinnedDeviceMemoryLimit', "
            "'defaultPerDevicePinnedMemoryLimit', 'multiUser']))",
            f"{_AT}.sharing.mpsConfig: an object of defaultActiveThreadPercentage, "
            "defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit and "
            "multiUser, no other field'",
        ),
        Rule(
            "variables.mpsMaps.all(m, !('defaultActiveThreadPercentage' in m) || "
            "m.defaultActiveThreadPercentage == null || "
            "(type(m.defaultActiveThreadPercentage) == int && "
            "m.defaultActiveThreadPercentage >= 0 && m.defaultActiveThreadPercentage <= 100))",
            f"{_AT}.sharing.mpsConfig.defaultActiveThreadPercentage: a whole number from 0 "
            "to 100; got ' + variables.mpsMaps.filter(m, 'defaultActiveThreadPercentage' in m "
            "&& m.defaultActiveThreadPercentage != null)"
            ".map(m, string(m.defaultActiveThreadPercentage)).join(', ')",
            "spec.devices.config[].opaque.parameters.sharing.mpsConfig."
            "defaultActiveThreadPercentage: a whole number from 0 to 100",
        ),
        Rule(
            "variables.mpsMaps.all(m, !('multiUser' in m) || m.multiUser == null || "
            "type(m.multiUser) == bool)",
            f"{_AT}.sharing.mpsConfig.multiUser: true or false (a JSON boolean)'",
        ),
        Rule(
            "variables.mpsMaps.all(m, (!('defaultPinnedDeviceMemoryLimit' in m) || "
            "m.defaultPinnedDeviceMemoryLimit == null || "
            f"{_quantity('m.defaultPinnedDeviceMemoryLimit')}) && "
            "(!('defaultPerDevicePinnedMemoryLimit' in m) || "
            "m.defaultPerDevicePinnedMemoryLimit == null || "
            "(type(m.defaultPerDevicePinnedMemoryLimit) == map && "
            f"size(m.defaultPerDevicePinnedMemoryLimit) <= {PER_DEVICE_LIMITS} && "
            "m.defaultPerDevicePinnedMemoryLimit.all(d, "
            f"{_quantity('m.defaultPerDevicePinnedMemoryLimit[d]')}))))",
            f"{_AT}.sharing.mpsConfig: defaultPinnedDeviceMemoryLimit and the values of "
            f"defaultPerDevicePinnedMemoryLimit (at most {PER_DEVICE_LIMITS}) must be "
            "quantities of at least 1Mi (e.g. 2Gi, 1073741824)'",
        ),
    ),
)
"""NVIDIA's strict decoding and validation of the `sharing` block, as CEL: what
`GpuSharing`, `MigSharing`, `MpsConfig` and `check_sharing` refuse, refused at admission."""
