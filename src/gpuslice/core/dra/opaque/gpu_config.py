"""NVIDIA's `GpuConfig`: how a whole GPU is shared (time-slicing with an interval, or MPS)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuslice.core.dra.opaque.base import SHARING, OpaqueKind, SharingSlot, StrictModel
from gpuslice.core.dra.opaque.nvidia import (
    ADMISSION,
    NVIDIA_API,
    GpuSharing,
    check_sharing,
    contribute_sharing,
)


class GpuConfig(StrictModel):
    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


def _contribute(cfg: GpuConfig, source: str) -> SharingSlot:
    return contribute_sharing(cfg.sharing, source)


def _check(cfg: GpuConfig, where: str) -> None:
    check_sharing(cfg.sharing, where)


KIND = OpaqueKind(
    api_version=NVIDIA_API,
    kind="GpuConfig",
    model=GpuConfig,
    slot=SHARING,
    fits=frozenset({"gpu"}),
    contribute=_contribute,
    check=_check,
    admission=ADMISSION,
)
