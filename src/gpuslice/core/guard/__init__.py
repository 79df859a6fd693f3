"""The memory guard's pure policy: who may borrow GPU memory, and who is stopped."""

from gpuslice.core.guard.model import (
    ContainerKey,
    Decision,
    GpuMemory,
    GuardParams,
    GuardState,
    Reserve,
    Tenant,
    effective_mode,
    holder_mode,
    lookahead_for,
)
from gpuslice.core.guard.policy import Evaluation, evaluate, tenants_from

__all__ = [
    "ContainerKey",
    "Decision",
    "Evaluation",
    "GpuMemory",
    "GuardParams",
    "GuardState",
    "Reserve",
    "Tenant",
    "effective_mode",
    "evaluate",
    "holder_mode",
    "lookahead_for",
    "tenants_from",
]
