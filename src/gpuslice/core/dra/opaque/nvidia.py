"""What NVIDIA's two sharing kinds (`GpuConfig`, `MigDeviceConfig`) have in common, field
for field with `resource.nvidia.com/v1beta1` (REFERENCE-DRA §5.3): the MPS and
time-slicing blocks, and how a `sharing` block becomes the device's `Sharing`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, field_validator

from gpuslice.core.dra.opaque.base import (
    INTERVALS,
    ClaimConfigError,
    JsonInt,
    JsonQuantity,
    MpsSettings,
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
    if SharingStrategy.from_nvidia(sharing.strategy) is SharingStrategy.MPS:
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
    return SharingSlot(strategy=sharing.strategy, interval=interval, mps=mps, source=source)
