"""Allocation policy: which devices to prefer, and what a container gets for them.

Pure functions over the sharing plan; the kubelet adapter calls them and converts the
result to protobuf.
"""

from gpuslice.core.allocation.preferred import pair_score, preferred_allocation
from gpuslice.core.allocation.response import (
    CONTROL_DEVICE_NODES,
    ContainerAllocation,
    DeviceSpec,
    Mount,
    build_allocation,
)
from gpuslice.core.allocation.validation import validate_request

__all__ = [
    "CONTROL_DEVICE_NODES",
    "ContainerAllocation",
    "DeviceSpec",
    "Mount",
    "build_allocation",
    "pair_score",
    "preferred_allocation",
    "validate_request",
]
