"""The kubelet's PodResources API: a client (who holds which device) and an emulator.

The emulator lives beside the client because tests and `gpuslice demo` need a kubelet-side
server that speaks the same protocol over a real unix socket.
"""

from gpuslice.podresources.claims import (
    ClaimBooks,
    ClaimDevice,
    ContainerClaim,
    claim_device_id,
    claim_resource,
)
from gpuslice.podresources.client import PodResourcesClient, PodResourcesError
from gpuslice.podresources.emulator import PodResourcesEmulator

__all__ = [
    "ClaimBooks",
    "ClaimDevice",
    "ContainerClaim",
    "PodResourcesClient",
    "PodResourcesEmulator",
    "PodResourcesError",
    "claim_device_id",
    "claim_resource",
]
