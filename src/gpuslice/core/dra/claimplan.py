"""Prepared claims seen as a `Plan`, so attribution, the memory guard and the exporter serve
DRA claims with the code that serves device-plugin replicas.

Each prepared claim becomes one resource named `claim:<namespace>/<name>`, each of its
devices one advertised device with the ID the PodResources adapter gives DRA devices
(`<pool>/<device>`, or `<pool>/<device>/<shareID>` for a share). Entitlements come from
the claim: a share's consumed memory, an MPS claim's pinned limit, else the device's memory
divided among the pods the claim's GuardConfig says share it (`sharedBy`, 1 by default).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuslice.core.devices import Inventory
from gpuslice.core.dra.prepared import DeviceUse, PreparedClaim
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MpsShare,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)

CLAIM_PREFIX = "claim:"


def claim_resource(namespace: str, name: str) -> ResourceName:
    return ResourceName(f"{CLAIM_PREFIX}{namespace}/{name}")


def dra_device_id(pool: str, device: str, share_id: str | None = None) -> DeviceId:
    """How a DRA device held by a container is named in attribution (PodResources gives
    pool, device and shareID)."""
    return DeviceId(f"{pool}/{device}/{share_id}" if share_id else f"{pool}/{device}")


def _physicals(inventory: Inventory) -> dict[str, PhysicalDevice]:
    out: dict[str, PhysicalDevice] = {}
    for gpu in inventory.gpus:
        out[gpu.uuid] = PhysicalDevice.of_gpu(gpu)
        for mig in gpu.mig_devices:
            out[mig.uuid] = PhysicalDevice.of_mig(gpu, mig)
    return out


def _advertised(use: DeviceUse, pool: str, physical: PhysicalDevice) -> AdvertisedDevice:
    mps = None
    if use.strategy == SharingStrategy.MPS:
        # what the claim's record does not say is an even share among its pods (None: a
        # unified-memory GPU, whose MPS shares have no pinned memory limit)
        even = MpsShare.even(physical, use.shared_by)
        mps = MpsShare(
            use.thread_percentage or even.active_thread_percentage,
            use.entitlement_mib or even.pinned_memory_limit_mib or None,
        )
    shared = use.shared_by > 1 or use.share_id is not None
    return AdvertisedDevice(
        id=dra_device_id(pool, use.device, use.share_id),
        physical=physical,
        replica=0 if shared else None,
        replicas=max(use.shared_by, 1),
        mps=mps,
        entitlement_mib=use.entitlement_mib,
    )


def claims_plan(claims: Iterable[PreparedClaim], inventory: Inventory, pool: str) -> Plan:
    """One resource per completed claim; devices no longer in the inventory are left out."""
    physicals = _physicals(inventory)
    resources: list[ResourcePlan] = []
    for claim in sorted(claims, key=lambda c: (c.namespace, c.name, c.uid)):
        if claim.state != "PrepareCompleted":
            continue
        devices = tuple(
            _advertised(use, pool, physicals[use.physical_uuid])
            for use in claim.uses
            # an adminAccess holder (monitoring, debugging) is no tenant of the device
            if use.physical_uuid in physicals and not use.admin
        )
        if not devices:
            continue
        strategies = {u.strategy for u in claim.uses}
        strategy = next(
            (s for s in (SharingStrategy.MPS, SharingStrategy.TIME_SLICING) if s in strategies),
            SharingStrategy.NONE,
        )
        name = claim_resource(claim.namespace, claim.name)
        resources.append(ResourcePlan(name, name, strategy, False, devices))
    return Plan(tuple(resources))


def sharing_claims(claims: Iterable[PreparedClaim]) -> frozenset[ResourceName]:
    """The completed claims that hold a device on a GPU they share with another claim, or a
    share of one (offered as shares, it can get neighbours at any time): their pods' memory
    and a neighbour's come out of one GPU, so what the guard does to one is felt by the
    other. adminAccess holders are no tenants and share nothing; MIG devices have their own
    memory and UUID, so claims on different MIG devices of one GPU do not share."""
    done = [c for c in claims if c.state == "PrepareCompleted"]
    holders: dict[str, set[ResourceName]] = {}
    offered: set[ResourceName] = set()
    for claim in done:
        name = claim_resource(claim.namespace, claim.name)
        for use in claim.uses:
            if use.admin:
                continue
            holders.setdefault(use.physical_uuid, set()).add(name)
            if use.share_id is not None:
                offered.add(name)
    crowded = {n for names in holders.values() if len(names) > 1 for n in names}
    return frozenset(offered | crowded)
