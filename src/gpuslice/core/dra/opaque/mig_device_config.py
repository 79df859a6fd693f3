"""NVIDIA's `MigDeviceConfig`: how a MIG device is shared (time-slicing, or MPS)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuslice.core.dra.opaque.base import SHARING, OpaqueKind, SharingSlot, StrictModel
from gpuslice.core.dra.opaque.nvidia import (
    ADMISSION,
    NVIDIA_API,
    MigSharing,
    check_sharing,
    contribute_sharing,
)


class MigDeviceConfig(StrictModel):
    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: MigSharing | None = None


def _contribute(cfg: MigDeviceConfig, source: str) -> SharingSlot:
    return contribute_sharing(cfg.sharing, source)


def _check(cfg: MigDeviceConfig, where: str) -> None:
    check_sharing(cfg.sharing, where)


KIND = OpaqueKind(
    api_version=NVIDIA_API,
    kind="MigDeviceConfig",
    model=MigDeviceConfig,
    slot=SHARING,
    fits=frozenset({"mig"}),
    contribute=_contribute,
    check=_check,
    admission=ADMISSION,
)
