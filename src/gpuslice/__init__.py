"""gpuslice: share NVIDIA GPUs between Kubernetes pods (time-slicing, MPS, MIG)."""

__version__ = "0.1.0"
