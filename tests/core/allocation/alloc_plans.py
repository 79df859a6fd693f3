"""Builders for hand-made inventories and resource plans (no `build_plan` needed)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.core.devices import Gpu, GpuUuid, MigDevice, MigUuid
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MpsShare,
    PhysicalDevice,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
    replica_id,
)


def gpu(index: int, *, memory_mib: int = 15360, sms: int = 40, numa: int | None = None) -> Gpu:
    return Gpu(
        index=index,
        uuid=GpuUuid(f"GPU-{index:04d}"),
        product_name="Tesla T4",
        memory_mib=memory_mib,
        multiprocessors=sms,
        compute_capability=(7, 5),
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
        minor=index + 10,
        numa_node=numa,
    )


def mig_gpu(index: int, profiles: Sequence[tuple[str, int, int, int, int]]) -> Gpu:
    """A MIG-enabled A100; `profiles` = (profile, gi, ci, memory MiB, SMs) per MIG device."""
    base = gpu(index, memory_mib=40960, sms=108)
    migs = tuple(
        MigDevice(
            uuid=MigUuid(f"MIG-{index:02d}{j:02d}"),
            parent_uuid=base.uuid,
            parent_index=index,
            index=j,
            profile=profile,
            gi_id=gi,
            ci_id=ci,
            memory_mib=mem,
            multiprocessors=sms,
            slices_gi=1,
            slices_ci=1,
            placement_start=j,
            placement_size=1,
        )
        for j, (profile, gi, ci, mem, sms) in enumerate(profiles)
    )
    return Gpu(
        index=base.index,
        uuid=base.uuid,
        product_name="NVIDIA A100-SXM4-40GB",
        memory_mib=base.memory_mib,
        multiprocessors=base.multiprocessors,
        compute_capability=(8, 0),
        pci_bus_id=base.pci_bus_id,
        minor=base.minor,
        mig_capable=True,
        mig_enabled=True,
        mig_devices=migs,
    )


def whole(g: Gpu) -> PhysicalDevice:
    return PhysicalDevice.of_gpu(g)


def mig(g: Gpu, j: int) -> PhysicalDevice:
    return PhysicalDevice.of_mig(g, g.mig_devices[j])


def shared(
    physical: Sequence[PhysicalDevice],
    replicas: int,
    *,
    name: str = "nvidia.com/gpu",
    strategy: SharingStrategy = SharingStrategy.TIME_SLICING,
    fail_over_one: bool = True,
) -> ResourcePlan:
    devices: list[AdvertisedDevice] = []
    for phys in physical:
        share = None
        if strategy == "mps":
            share = MpsShare(100 // replicas, phys.memory_mib // replicas)
        devices.extend(
            AdvertisedDevice(replica_id(phys.uuid, n), phys, n, replicas, share)
            for n in range(replicas)
        )
    return ResourcePlan(
        name=ResourceName(name),
        label_name=ResourceName(name),
        strategy=strategy,
        fail_requests_greater_than_one=fail_over_one,
        devices=tuple(devices),
    )


def exclusive(physical: Sequence[PhysicalDevice], *, name: str = "nvidia.com/gpu") -> ResourcePlan:
    return ResourcePlan(
        name=ResourceName(name),
        label_name=ResourceName(name),
        strategy=SharingStrategy.NONE,
        fail_requests_greater_than_one=False,
        devices=tuple(AdvertisedDevice(DeviceId(p.uuid), p, None, 1) for p in physical),
    )
