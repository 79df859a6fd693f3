"""The `version: v1` config: schema, parsing with user-facing errors, CLI/env overrides."""

from gpuslice.core.config.allocate_settings import allocate_settings
from gpuslice.core.config.fields import DeviceSelection
from gpuslice.core.config.overrides import NVIDIA_ORIGINS, Override, apply_overrides
from gpuslice.core.config.parsing import parse_config, validate_document
from gpuslice.core.config.schema import (
    DEFAULT_MPS_ROOT,
    Config,
    Flags,
    GfdFlags,
    Imex,
    PluginFlags,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    Sharing,
)

__all__ = [
    "DEFAULT_MPS_ROOT",
    "NVIDIA_ORIGINS",
    "Config",
    "DeviceSelection",
    "Flags",
    "GfdFlags",
    "Imex",
    "Override",
    "PluginFlags",
    "ReplicatedResource",
    "ReplicatedResources",
    "ResourcePattern",
    "Resources",
    "Sharing",
    "allocate_settings",
    "apply_overrides",
    "parse_config",
    "validate_document",
]
