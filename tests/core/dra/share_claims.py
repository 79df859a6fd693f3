"""A claim allocated one share of a device with nothing recorded in `consumedCapacity`:
what Prepare then gives it is the device's default (`ShareOffer.default_memory_mib`), the
case the share-mode and the table's agreement tests both read."""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.core.dra.claims import ClaimWork, claim_work
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import DraDevice, ShareOffer

DRIVER = "gpu.nvidia.com"
POOL = "n1"
REF = ClaimRef("ns", "uid-1", "c")


def unrecorded_share(
    device: str, devices: Mapping[str, DraDevice], offers: Mapping[str, ShareOffer]
) -> ClaimWork:
    """Prepare's work for a claim holding share `s-1` of `device` with no capacity recorded."""
    result = {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": device,
              "shareID": "s-1", "consumedCapacity": {}}  # fmt: skip
    claim = {
        "metadata": {"uid": REF.uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    return claim_work(claim, REF, driver=DRIVER, pool=POOL, devices=devices, offers=offers)
