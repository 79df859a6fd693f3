"""The node's policy per device, built once with each plan snapshot and read by all.

Before this table each reader derived what a device is offered from the plan on its own:
the slice publisher, the driver at Prepare and `describe --claims` each listed the DRA
devices and decided the shares, so a rule changed in one place could publish one offer and
prepare another. Here one function decides a device's share (`share_offers`), and a
snapshot's `NodePolicy` computes the DRA offer once for everyone who asks with the same
node settings (`dra_offer`), so the publisher, Prepare and the health stream see the very
same devices and offers.

Each device's entitlement is on the table too (`entitlements`): what one replica of it gives
its holder (`core.attribution.entitlement_of`, the rule the exporter, the guard and the caps
loop count holders by), and what of memory caps the plan alone fixes (`DeviceEntitlement`:
whether its holders can be capped at all, and to what under a caps policy). Allocate reads
it there. Who holds what at a moment (`core.protection`) is not on it: that follows the
kubelet's assignments and, in DRA mode, the prepared claims, which change without a new
snapshot.

What depends on the running node rather than on the plan (the MIG devices gpuslice created
on dynamic MIG GPUs, whether the API server takes partitions) is part of the question, not
of the snapshot: the last offer is kept with its question, and the publisher and the driver
ask the same one, so it is built once until a Prepare or an Unprepare on a dynamic MIG GPU
changes the answer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from gpuslice.core.attribution import Entitlement, entitlement_of
from gpuslice.core.caps import CapPolicy, MemoryLimits, cappable, limits_for
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.partitions import (
    DynamicGpu,
    Partition,
    counter_sets,
    dynamic_gpus,
    node_devices,
)
from gpuslice.core.dra.publish import REPLICAS, DraDevice, ShareOffer, SharesMode, dra_devices
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import MpsShare, Plan, ResourcePlan, SharingStrategy
from gpuslice.core.units import MIB


@dataclass(frozen=True, slots=True)
class DeviceSharing:
    """How the node's config shares one physical device (GPU or MIG device)."""

    strategy: SharingStrategy
    """TIME_SLICING or MPS (a device the config does not share has no entry)."""
    replicas: int
    memory_mib: int


def device_sharing(plan: Plan) -> dict[str, DeviceSharing]:
    """Physical UUID -> how the plan shares it, for every device it shares more than one
    way."""
    out: dict[str, DeviceSharing] = {}
    for resource in plan.resources:
        if resource.strategy == SharingStrategy.NONE:
            continue
        for dev in resource.devices:
            if dev.replicas > 1:
                out[dev.physical.uuid] = DeviceSharing(
                    resource.strategy, dev.replicas, dev.physical.memory_mib
                )
    return out


@dataclass(frozen=True, slots=True)
class DeviceEntitlement:
    """What each replica of one device (a GPU or a MIG device, shared or not) entitles its
    holder to, read once from the plan."""

    each: Entitlement
    """One replica's: its kind, memory (0 where nothing is reserved: a unified-memory GPU,
    an MPS share without a pinned limit) and SM fraction of the GPU."""
    thread_percentage: int | None
    """An MPS replica's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`; None for any other."""
    device_bytes: int
    """The device's memory (0 on a unified-memory GPU)."""
    whole_gpu: bool

    @property
    def cappable(self) -> bool:
        """Whether the driver may cap its holders, wherever the GPU allows caps
        (`core.caps.cappable`: MIG, MPS and exclusive holders never are)."""
        return cappable(self.each.kind, self.whole_gpu, self.device_bytes)

    def limits(self, policy: CapPolicy, held: int = 1) -> MemoryLimits | None:
        """The limits of a container holding `held` of its replicas (they add up: two of
        four hold half the GPU), None where its holders are not capped."""
        if not self.cappable:
            return None
        entitlement = Entitlement(self.each.kind, self.each.memory_bytes * held, None)
        return limits_for(entitlement, self.device_bytes, policy)


def device_entitlements(
    resources: Iterable[ResourcePlan], gpu_sms: Mapping[str, int]
) -> dict[str, DeviceEntitlement]:
    """Physical UUID -> the entitlement of each of its replicas in `resources`, `gpu_sms`
    giving each GPU's SM count (a MIG device's SM fraction). An MPS replica handed without
    its share (a hand-built plan) gets the even one (`MpsShare.even`)."""
    out: dict[str, DeviceEntitlement] = {}
    for resource in resources:
        for dev in resource.devices:
            phys = dev.physical
            if phys.uuid in out:
                continue
            if resource.strategy is SharingStrategy.MPS and dev.mps is None:
                dev = replace(dev, mps=MpsShare.even(phys, dev.replicas))
            out[phys.uuid] = DeviceEntitlement(
                entitlement_of(dev, gpu_sms.get(phys.gpu_uuid)),
                dev.mps.active_thread_percentage if dev.mps is not None else None,
                phys.memory_mib * MIB,
                phys.kind == "gpu",
            )
    return out


def share_offers(
    plan: Plan | Mapping[str, DeviceSharing],
    mode: SharesMode = REPLICAS,
    devices: Iterable[DraDevice] = (),
) -> dict[str, ShareOffer]:
    """Physical UUID (GPU or MIG device) -> its offer: the one rule for a device's share. In
    `replicas` mode, every device the plan shares by time-slicing or MPS: the config users
    already have decides which GPUs DRA shares. In NVIDIA's modes, every one of `devices`
    (as NVIDIA's driver offers every GPU and MIG device), shared by MPS where the node's
    config says so, else time-sliced."""
    if mode.kind == "disabled":
        return {}
    sharing = device_sharing(plan) if isinstance(plan, Plan) else plan
    if mode.kind == "replicas":
        return {
            uuid: ShareOffer(s.replicas, s.strategy, s.memory_mib) for uuid, s in sharing.items()
        }
    return {
        d.uuid: ShareOffer(
            mode.count or 1,
            sharing[d.uuid].strategy if d.uuid in sharing else SharingStrategy.TIME_SLICING,
            d.capacity.get("memory", 0) // MIB,
            mode.kind,
        )
        for d in devices
    }


@dataclass(frozen=True, slots=True)
class DraOffer:
    """What this node offers as a DRA driver: the devices in the order they are published
    (a dynamic MIG GPU's partitions in place of its MIG devices), the dynamic GPUs, and the
    devices offered as consumable shares."""

    devices: tuple[DraDevice, ...]
    dynamic: Mapping[str, DynamicGpu]
    """GPU UUID -> its partitions and counter set, for the GPUs published as dynamic MIG."""
    shares: Mapping[str, ShareOffer]
    """Device UUID -> its offer. A dynamic GPU's partitions are never offered as shares: a
    partition has no UUID until a claim makes it."""

    def by_name(self) -> dict[str, DraDevice]:
        return {d.name: d for d in self.devices}

    def offers_by_name(self) -> dict[str, ShareOffer]:
        """Device name -> its offer (what Prepare reads a claim's shares against)."""
        return {d.name: self.shares[d.uuid] for d in self.devices if d.uuid in self.shares}

    def partitions(self) -> dict[str, Partition]:
        """Device name -> the dynamic MIG partition it is."""
        return {name: p for d in self.dynamic.values() for name, p in d.partitions.items()}

    def counter_sets(self) -> list[Json]:
        return counter_sets(self.dynamic)


def dra_offer(
    sharing: Mapping[str, DeviceSharing],
    inventory: Inventory,
    shares: SharesMode,
    dynamic: Collection[str],
    ours: Collection[str],
) -> DraOffer:
    """The node's DRA offer, as `--consumable-shares shares` asks, for the GPUs `dynamic`
    marks as dynamic MIG ones (`core.dra.partitions.is_dynamic`), `ours` naming the MIG
    devices gpuslice created on them."""
    static = dra_devices(inventory)
    dyn = dynamic_gpus(inventory, dynamic, ours)
    devices = node_devices(static, dyn) if dyn else static
    offers = share_offers(sharing, shares, [d for d in devices if d.gpu.uuid not in dyn])
    return DraOffer(devices, dyn, offers)


class NodePolicy:
    """One plan snapshot's policy per device: its sharing (`sharing`), its entitlements
    (`entitlements`) and its DRA offer (`offer`), each computed once for every reader of
    the snapshot."""

    __slots__ = ("_inventory", "_last", "entitlements", "sharing")

    def __init__(self, plan: Plan, inventory: Inventory) -> None:
        self._inventory = inventory
        self.sharing: Mapping[str, DeviceSharing] = device_sharing(plan)
        """Physical UUID -> how the node's config shares it."""
        self.entitlements: Mapping[str, DeviceEntitlement] = device_entitlements(
            plan.resources, {g.uuid: g.multiprocessors for g in inventory.gpus}
        )
        """Physical UUID -> what each of its replicas entitles its holder to."""
        self._last: tuple[tuple[SharesMode, frozenset[str], frozenset[str]], DraOffer] | None
        self._last = None
        """The last offer asked for, with its question: the publisher and the driver ask the
        same one, which changes only when a Prepare or an Unprepare changes `ours`."""

    def offer(
        self,
        shares: SharesMode = REPLICAS,
        *,
        dynamic: Collection[str] = (),
        ours: Collection[str] = frozenset(),
    ) -> DraOffer:
        """The DRA offer (`dra_offer`) for these node settings, built on the first ask."""
        key = (shares, frozenset(dynamic), frozenset(ours))
        if self._last is None or self._last[0] != key:
            self._last = (key, dra_offer(self.sharing, self._inventory, *key))
        return self._last[1]
