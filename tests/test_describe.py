"""The describe report: counts, hardware, and each share in words."""

from __future__ import annotations

import json

import yaml

from gpuslice.core.describe import describe, gib, report_to_dict
from gpuslice.core.devices import Gpu, GpuUuid, Inventory, MigDevice, MigUuid
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MpsShare,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
    replica_id,
)

T4 = Gpu(0, GpuUuid("GPU-t4"), "Tesla T4", 15360, 40, (7, 5), "00000000:01:00.0", 0)
L40S = Gpu(1, GpuUuid("GPU-l40s"), "NVIDIA L40S", 46068, 142, (8, 9), "00000000:02:00.0", 1)
MIG_A = MigDevice(
    MigUuid("MIG-a"), GpuUuid("GPU-a100"), 2, 0, "1g.10gb", 9, 0, 9728, 14, 1, 1, 0, 1
)
MIG_B = MigDevice(
    MigUuid("MIG-b"), GpuUuid("GPU-a100"), 2, 1, "3g.40gb", 2, 0, 40192, 42, 3, 3, 4, 4
)
A100 = Gpu(
    2,
    GpuUuid("GPU-a100"),
    "NVIDIA A100-SXM4-80GB",
    81920,
    108,
    (8, 0),
    "00000000:03:00.0",
    2,
    mig_capable=True,
    mig_enabled=True,
    mig_devices=(MIG_A, MIG_B),
)
INV = Inventory(gpus=(A100, L40S, T4), driver_version="550.54.15", cuda_driver_version=12040)


def phys_gpu(g: Gpu) -> PhysicalDevice:
    return PhysicalDevice(
        g.uuid,
        g.index_id,
        g.uuid,
        g.index,
        "gpu",
        g.product_name,
        g.memory_mib,
        g.multiprocessors,
        g.minor,
    )


def phys_mig(m: MigDevice) -> PhysicalDevice:
    return PhysicalDevice(
        m.uuid,
        m.index_id,
        m.parent_uuid,
        m.parent_index,
        "mig",
        A100.product_name,
        m.memory_mib,
        m.multiprocessors,
        A100.minor,
        profile=m.profile,
        gi_id=m.gi_id,
        ci_id=m.ci_id,
    )


def resource(
    name: str,
    strategy: SharingStrategy,
    phys: PhysicalDevice,
    replicas: int,
    mps: MpsShare | None = None,
) -> ResourcePlan:
    devices: tuple[AdvertisedDevice, ...]
    if replicas == 1:
        devices = (AdvertisedDevice(DeviceId(phys.uuid), phys, None, 1),)
    else:
        devices = tuple(
            AdvertisedDevice(replica_id(phys.uuid, n), phys, n, replicas, mps)
            for n in range(replicas)
        )
    return ResourcePlan(ResourceName(name), ResourceName(name), strategy, True, devices)


PLAN = Plan(
    resources=(
        resource("nvidia.com/gpu", SharingStrategy.TIME_SLICING, phys_gpu(T4), 4),
        resource("nvidia.com/gpu.mps", SharingStrategy.MPS, phys_gpu(L40S), 10, MpsShare(10, 4606)),
        resource("nvidia.com/mig-1g.10gb", SharingStrategy.NONE, phys_mig(MIG_A), 1),
        resource("nvidia.com/mig-3g.40gb", SharingStrategy.TIME_SLICING, phys_mig(MIG_B), 2),
    ),
    mig_strategy="mixed",
    warnings=("GPU 2: MIG mode pending reboot",),
)


def test_counts_and_warnings() -> None:
    data = report_to_dict(describe(PLAN, INV))
    assert data["resources"] == {
        "nvidia.com/gpu": 4,
        "nvidia.com/gpu.mps": 10,
        "nvidia.com/mig-1g.10gb": 1,
        "nvidia.com/mig-3g.40gb": 2,
    }
    assert data["warnings"] == ["GPU 2: MIG mode pending reboot"]
    assert data["mig_strategy"] == "mixed"


def test_gpus_in_index_order_with_their_hardware() -> None:
    report = describe(PLAN, INV)
    assert [g.index for g in report.devices] == [0, 1, 2]
    a100 = report.devices[2]
    assert (a100.product, a100.memory_mib, a100.multiprocessors) == (
        "NVIDIA A100-SXM4-80GB",
        81920,
        108,
    )
    assert [(m.profile, m.memory_mib, m.multiprocessors, m.index_id) for m in a100.mig_devices] == [
        ("1g.10gb", 9728, 14, "2:0"),
        ("3g.40gb", 40192, 42, "2:1"),
    ]


def test_time_slicing_share_in_words() -> None:
    [share] = describe(PLAN, INV).devices[0].shares
    assert share.replicas == 4
    assert share.ids == ("GPU-t4::0", "GPU-t4::1", "GPU-t4::2", "GPU-t4::3")
    assert share.share == "1/4 of the time, no memory isolation, 3.75 GiB if shared evenly"


def test_mps_share_in_words_for_an_l40s_with_ten_replicas() -> None:
    [share] = describe(PLAN, INV).devices[1].shares
    assert share.share == (
        "10% of SMs (14 of 142), pinned memory limit 4606 MiB; total_memory inside the pod "
        "still reports the whole GPU (45 GiB): the limit is enforced by MPS, not shown by CUDA"
    )


def test_mig_shares_in_words() -> None:
    shares = describe(PLAN, INV).devices[2].shares
    assert [(s.resource, s.device_index) for s in shares] == [
        ("nvidia.com/mig-1g.10gb", "2:0"),
        ("nvidia.com/mig-3g.40gb", "2:1"),
    ]
    assert shares[0].share == "1g.10gb: 9.5 GiB, 14 SMs, hardware-isolated"
    assert shares[1].share.startswith(
        "1/2 of the time of MIG 3g.40gb (39.2 GiB, 42 SMs), no memory isolation"
    )
    assert shares[1].share.endswith("no memory isolation, 19.6 GiB if shared evenly")


def test_exclusive_gpu_is_a_whole_gpu() -> None:
    plan = Plan(resources=(resource("nvidia.com/gpu", SharingStrategy.NONE, phys_gpu(T4), 1),))
    [share] = describe(plan, INV).devices[0].shares
    assert share.share == "whole GPU"
    assert describe(plan, INV).devices[1].shares == ()


def test_dict_survives_json_and_yaml() -> None:
    data = report_to_dict(describe(PLAN, INV))
    assert json.loads(json.dumps(data)) == data
    assert yaml.safe_load(yaml.safe_dump(data)) == data
    device0 = json.loads(json.dumps(data))["devices"][0]
    assert device0["resources"][0]["share"].startswith("1/4 of the time")
    assert device0["memory"] == "15 GiB"


def test_gib_formatting() -> None:
    assert [gib(m) for m in (46068, 3840, 9728, 512, 143771, 81920)] == [
        "45",
        "3.75",
        "9.5",
        "0.5",
        "140",
        "80",
    ]
