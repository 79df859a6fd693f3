"""Hand-built inventories and plans for the label tests (independent of `build_plan`).

Numbers are the ones real nodes report (REFERENCE.md and the seed documents): Tesla T4
15360 MiB, L40S 46068 MiB, A100 80GB PCIe 81920 MiB with `1g.10gb` MIG devices of 9728 MiB
and 14 SMs.
"""

from __future__ import annotations

from gpuslice.core.devices import Gpu, GpuUuid, Inventory, MigDevice, MigUuid
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MigStrategy,
    MpsShare,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
    replica_id,
)

T4 = ("Tesla T4", 15360, 40, (7, 5))
L40S = ("NVIDIA L40S", 46068, 142, (8, 9))
A100_80 = ("NVIDIA A100 80GB PCIe", 81920, 108, (8, 0))


def gpu(
    index: int,
    model: tuple[str, int, int, tuple[int, int]],
    *,
    mig_capable: bool = False,
    mig_enabled: bool = False,
    migs: int = 0,
    profile: str = "1g.10gb",
    mig_mib: int = 9728,
    mig_sms: int = 14,
) -> Gpu:
    name, mib, sms, cc = model
    uuid = GpuUuid(f"GPU-{index:08d}-0000-0000-0000-000000000000")
    devices = tuple(
        MigDevice(
            uuid=MigUuid(f"MIG-{index:04d}{j:04d}-0000-0000-0000-000000000000"),
            parent_uuid=uuid,
            parent_index=index,
            index=j,
            profile=profile,
            gi_id=7 + j,
            ci_id=0,
            memory_mib=mig_mib,
            multiprocessors=mig_sms,
            slices_gi=1,
            slices_ci=1,
            placement_start=j,
            placement_size=1,
            engines_copy=1,
        )
        for j in range(migs)
    )
    return Gpu(
        index=index,
        uuid=uuid,
        product_name=name,
        memory_mib=mib,
        multiprocessors=sms,
        compute_capability=cc,
        pci_bus_id=f"00000000:{index + 7:02x}:00.0",
        minor=index,
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=devices,
    )


def inventory(*gpus: Gpu, driver: str = "550.54.14", cuda: int = 12040) -> Inventory:
    return Inventory(gpus=gpus, driver_version=driver, cuda_driver_version=cuda)


def physical_gpu(g: Gpu) -> PhysicalDevice:
    return PhysicalDevice.of_gpu(g)


def physical_mig(g: Gpu, m: MigDevice) -> PhysicalDevice:
    return PhysicalDevice.of_mig(g, m)


def resource(
    label_name: str,
    physicals: list[PhysicalDevice],
    *,
    replicas: int | list[int] = 1,
    strategy: SharingStrategy = SharingStrategy.NONE,
    name: str | None = None,
) -> ResourcePlan:
    """A resource whose i-th physical device is shared `replicas[i]` ways."""
    counts = replicas if isinstance(replicas, list) else [replicas] * len(physicals)
    devices: list[AdvertisedDevice] = []
    for phys, n in zip(physicals, counts, strict=True):
        mps = MpsShare(100 // n, phys.memory_mib // n) if strategy == "mps" else None
        if n == 1 and strategy == "none":
            devices.append(AdvertisedDevice(DeviceId(phys.uuid), phys, None, 1))
            continue
        for r in range(n):
            devices.append(AdvertisedDevice(replica_id(phys.uuid, r), phys, r, n, mps))
    return ResourcePlan(
        name=ResourceName(name or label_name),
        label_name=ResourceName(label_name),
        strategy=strategy,
        fail_requests_greater_than_one=strategy != "none",
        devices=tuple(devices),
    )


def plan(*resources: ResourcePlan, mig_strategy: MigStrategy = "none") -> Plan:
    return Plan(resources=resources, mig_strategy=mig_strategy)
