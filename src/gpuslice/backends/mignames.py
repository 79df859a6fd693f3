"""MIG profile names from what NVML reports about an instance.

NVML gives a MIG device's slice counts and memory, not the `1g.10gb` name every label,
resource name and config uses, so the NVML backend has to rebuild it. The memory part of the
name is not the instance's memory rounded: it is the instance's share of the GPU rounded up
to eighths, times the GPU's memory in whole GiB, rounded half up. That reproduces every name
in the MIG User Guide tables (A100 40/80GB, H100, H200, A30), which the tests check against
the simulated backend's tables.
"""

from __future__ import annotations

import math


def mig_memory_gb(instance_mib: int, gpu_mib: int) -> int:
    """The `<mem>gb` part of a profile name."""
    if instance_mib <= 0 or gpu_mib <= 0:
        return 0
    eighths = math.ceil(instance_mib * 8 / gpu_mib)
    gpu_gib = math.ceil(gpu_mib / 1024)
    return math.floor(eighths * gpu_gib / 8 + 0.5)


def mig_profile_name(
    *, gi_slices: int, ci_slices: int, instance_mib: int, gpu_mib: int, suffix: str = ""
) -> str:
    """`1g.10gb`, `1c.3g.20gb` (a compute instance smaller than its GPU instance), `...+me`."""
    gb = mig_memory_gb(instance_mib, gpu_mib)
    base = f"{gi_slices}g.{gb}gb{suffix}"
    if 0 < ci_slices < gi_slices:
        return f"{ci_slices}c.{base}"
    return base
