"""The simulator's GPU models: the tables live in the core (`gpuslice.core.gpumodels`) so
that `gpuslice advise` sizes MIG layouts from the very tables the simulator places them
with; this name is kept for the simulator and its tests."""

from gpuslice.core.gpumodels import (
    A30_MIG,
    A100_40GB_MIG,
    A100_80GB_MIG,
    H100_80GB_MIG,
    H200_MIG,
    MODELS,
    Architecture,
    GpuModel,
    MigGeometry,
    MigProfile,
    known_models,
)

__all__ = [
    "A30_MIG",
    "A100_40GB_MIG",
    "A100_80GB_MIG",
    "H100_80GB_MIG",
    "H200_MIG",
    "MODELS",
    "Architecture",
    "GpuModel",
    "MigGeometry",
    "MigProfile",
    "known_models",
]
