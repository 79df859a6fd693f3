"""gpuslice's `GuardConfig` (`resource.gpuslice.io/v1alpha1`): the memory guard's mode for
the claim's devices and how many pods are meant to share each. Its own API group, so
nothing is ever added to NVIDIA's kinds; its own slot, so it combines with a sharing kind
instead of competing with one."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuslice.core.dra.opaque.base import GUARD, GuardSlot, JsonInt, OpaqueKind, StrictModel

GPUSLICE_API = "resource.gpuslice.io/v1alpha1"


class GuardConfig(StrictModel):
    api_version: Literal["resource.gpuslice.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GuardConfig"]
    mode: Literal["off", "observe", "enforce"] | None = None
    shared_by: JsonInt | None = Field(None, alias="sharedBy", ge=1, le=4096)
    """How many pods are meant to share each device of the claim: each is entitled to
    1/sharedBy of its memory (as `replicas` does for the device plugin). Default 1."""


def _contribute(cfg: GuardConfig, source: str) -> GuardSlot:
    return GuardSlot(mode=cfg.mode, shared_by=cfg.shared_by)


KIND = OpaqueKind(
    api_version=GPUSLICE_API,
    kind="GuardConfig",
    model=GuardConfig,
    slot=GUARD,
    fits=frozenset({"gpu", "mig"}),
    contribute=_contribute,
)
