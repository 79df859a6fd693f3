"""The opaque config kinds this driver reads: a new kind is one line here (and its module).

The order is the order `unknown config kind` messages list them in."""

from __future__ import annotations

from typing import Any

from gpuslice.core.dra.opaque import gpu_config, guard_config, mig_device_config
from gpuslice.core.dra.opaque.base import OpaqueKind

KINDS: tuple[OpaqueKind[Any, Any], ...] = (
    gpu_config.KIND,
    mig_device_config.KIND,
    guard_config.KIND,
)
