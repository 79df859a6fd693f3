"""The simulator's GPU memory model: it lives in the core (`gpuslice.core.gpumemory`) so
that `gpuslice advise` replays recorded history through the same model the simulated
backend, the guard bench and the demo use; this name is kept for them."""

from gpuslice.core.gpumemory import (
    Allocation,
    Demand,
    GpuMemoryModel,
    OomDeath,
    RecordedDemand,
)

__all__ = ["Allocation", "Demand", "GpuMemoryModel", "OomDeath", "RecordedDemand"]
