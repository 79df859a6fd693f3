"""A DRA claims plan through attribution and the guard's view of it.

The claims plan is hand-built here the way the design note describes it (one resource
`claim:<ns>/<name>` per prepared claim, device IDs `<pool>/<device>[/<shareID>]`), so these
tests pin down what the driver's plan builder must hand over, not what it happens to do.
"""

from __future__ import annotations

import pytest

from gpuslice.agent.guard_view import shares_memory
from gpuslice.core.attribution import Entitlement, attribute, entitlement_of
from gpuslice.core.cgroups import CgroupIdentity, ContainerId, PodUid
from gpuslice.core.devices import Gpu, GpuUuid, Inventory, MigDevice, MigUuid
from gpuslice.core.guard import tenants_from
from gpuslice.core.guard.model import GuardMode
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
from gpuslice.core.units import MIB
from gpuslice.ports import ContainerDevices, GpuProcess

L40S = GpuUuid("GPU-44444444-0000-0000-0000-000000000000")
A100 = GpuUuid("GPU-33333333-0000-0000-0000-000000000000")
MIG_1G = MigUuid("MIG-aaaaaaaa-0000-0000-0000-000000000000")
GPU_L40S = Gpu(0, L40S, "NVIDIA L40S", 46068, 142, (8, 9), "00000000:04:00.0", 0)
GPU_A100 = Gpu(
    1,
    A100,
    "NVIDIA A100-SXM4-80GB",
    81920,
    108,
    (8, 0),
    "00000000:03:00.0",
    1,
    mig_capable=True,
    mig_enabled=True,
    mig_devices=(MigDevice(MIG_1G, A100, 1, 0, "1g.10gb", 9, 0, 9856, 14, 1, 1, 6, 1),),
)
INVENTORY = Inventory(
    gpus=(GPU_L40S, GPU_A100), driver_version="580.65.06", cuda_driver_version=13000
)


def dev(
    device_id: str,
    phys: PhysicalDevice,
    replicas: int = 1,
    *,
    mps: MpsShare | None = None,
    entitlement_mib: int | None = None,
) -> AdvertisedDevice:
    return AdvertisedDevice(
        DeviceId(device_id), phys, None, replicas, mps, entitlement_mib=entitlement_mib
    )


def claim(name: str, strategy: SharingStrategy, *devices: AdvertisedDevice) -> ResourcePlan:
    resource = ResourceName(f"claim:{name}")
    return ResourcePlan(resource, resource, strategy, False, devices)


WHOLE = PhysicalDevice.of_gpu(GPU_L40S)
MIG = PhysicalDevice.of_mig(GPU_A100, GPU_A100.mig_devices[0])


def test_a_share_is_entitled_to_its_consumed_memory_not_memory_over_replicas() -> None:
    """The scheduler may give one claim 3 shares' worth of memory out of 4: entitlement
    follows `entitlement_mib` (consumed capacity), the SM fraction stays 1/replicas."""
    share = dev("node-1/gpu-0/s1", WHOLE, 4, entitlement_mib=30000)
    # time-sliced: the SM share follows the share's memory (30000 of the L40S's 46068 MiB)
    assert entitlement_of(share, 142) == Entitlement(
        SharingStrategy.TIME_SLICING, 30000 * MIB, 30000 / WHOLE.memory_mib
    )


def test_an_mps_share_takes_its_memory_and_the_clients_thread_percentage() -> None:
    mps = MpsShare(active_thread_percentage=75, pinned_memory_limit_mib=34551)
    share = dev("node-1/gpu-0/s2", WHOLE, 4, mps=mps, entitlement_mib=30000)
    assert entitlement_of(share, 142) == Entitlement(SharingStrategy.MPS, 30000 * MIB, 0.75)


def test_a_claim_shared_by_pods_is_a_fair_share_and_alone_is_exclusive() -> None:
    """GuardConfig `sharedBy: 4` arrives as replicas 4 with no replica number (the device
    plugin never builds that): a fair share, as a time-slicing replica would get."""
    assert entitlement_of(dev("p/gpu-0", WHOLE, 4), 142) == Entitlement(
        SharingStrategy.TIME_SLICING, 46068 * MIB // 4, 0.25
    )
    assert entitlement_of(dev("p/gpu-0", WHOLE), 142) == Entitlement(
        SharingStrategy.NONE, 46068 * MIB, 1.0
    )


def test_a_mig_claim_is_its_mig_device_even_with_replicas() -> None:
    got = entitlement_of(dev("p/gpu-1-mig-9-0", MIG, 2), 108)
    assert (got.kind, got.memory_bytes) == ("mig", 9856 * MIB)
    assert got.sm_fraction == pytest.approx(14 / 108)


def test_device_plugin_entitlements_are_unchanged() -> None:
    """The new field defaults to None: replicas and MPS limits decide, as before."""
    replica = AdvertisedDevice(DeviceId(f"{L40S}::1"), WHOLE, 1, 4)
    assert entitlement_of(replica, 142) == Entitlement(
        SharingStrategy.TIME_SLICING, 46068 * MIB // 4, 0.25
    )
    mps = AdvertisedDevice(DeviceId(f"{L40S}::0"), WHOLE, 0, 2, MpsShare(50, 23034))
    assert entitlement_of(mps, 142) == Entitlement(SharingStrategy.MPS, 23034 * MIB, 0.5)


PLAN = Plan(
    resources=(
        claim(
            "ml/big",
            SharingStrategy.TIME_SLICING,
            dev("node-1/gpu-0/s1", WHOLE, 4, entitlement_mib=30000),
        ),
        claim(
            "ml/small",
            SharingStrategy.TIME_SLICING,
            dev("node-1/gpu-0/s2", WHOLE, 4, entitlement_mib=8000),
        ),
        claim("lab/tiny", SharingStrategy.NONE, dev("node-1/gpu-1-mig-9-0", MIG)),
    )
)
ASSIGNMENTS = (
    ContainerDevices("ml", "trainer", "main", "claim:ml/big", ("node-1/gpu-0/s1",)),
    ContainerDevices("ml", "infer", "srv", "claim:ml/small", ("node-1/gpu-0/s2",)),
    ContainerDevices("lab", "nb", "nb", "claim:lab/tiny", ("node-1/gpu-1-mig-9-0",)),
)
UIDS = {
    PodUid("u-trainer"): ("ml", "trainer"),
    PodUid("u-infer"): ("ml", "infer"),
    PodUid("u-nb"): ("lab", "nb"),
}


def ident(pod_uid: str, container_id: str) -> CgroupIdentity:
    return CgroupIdentity(PodUid(pod_uid), ContainerId(container_id), "containerd", "burstable")


PROCS = (
    GpuProcess(11, L40S, 32000 * MIB, sm_util_percent=60),
    GpuProcess(12, L40S, 4000 * MIB, sm_util_percent=10),
    GpuProcess(13, A100, 2000 * MIB, mig_uuid=MIG_1G),
)
IDENTITIES = {
    11: ident("u-trainer", "c1"),
    12: ident("u-infer", "c2"),
    13: ident("u-nb", "c3"),
}


def test_claims_are_attributed_per_pod_with_their_share() -> None:
    """Two shares of one GPU and a MIG claim: each process goes to the pod whose claim
    holds the device, with the share's memory as its entitlement."""
    att = attribute(ASSIGNMENTS, PLAN, PROCS, IDENTITIES, UIDS, inventory=INVENTORY)
    assert att.unattributed == ()
    assert att.unknown_device_ids == ()
    by_pod = {u.pod: u for u in att.usages}
    assert by_pod["trainer"].resources == ("claim:ml/big",)
    assert by_pod["trainer"].entitlement == Entitlement(
        SharingStrategy.TIME_SLICING, 30000 * MIB, 30000 / WHOLE.memory_mib
    )
    assert by_pod["trainer"].memory_used_bytes == 32000 * MIB
    assert by_pod["infer"].entitlement.memory_bytes == 8000 * MIB
    assert by_pod["nb"].entitlement.kind == "mig"
    assert by_pod["nb"].physical_uuids == (MIG_1G,)


def test_without_a_uid_map_two_shares_of_one_gpu_stay_ambiguous() -> None:
    """The sole-holder rule is no looser for claims: two claims on one GPU cannot be told
    apart without the pod UID map."""
    att = attribute(ASSIGNMENTS, PLAN, PROCS, IDENTITIES, None, inventory=INVENTORY)
    assert {p.pid: p.reason for p in att.unattributed} == {11: "ambiguous", 12: "ambiguous"}
    assert [u.pod for u in att.usages if u.pids] == ["nb"]


def test_tenants_take_their_claims_guard_mode() -> None:
    modes: dict[str, GuardMode] = {"claim:ml/big": "observe", "claim:lab/tiny": "off"}
    att = attribute(ASSIGNMENTS, PLAN, PROCS, IDENTITIES, UIDS, inventory=INVENTORY)
    tenants = {t.key.pod: t for t in tenants_from(att, modes.get)}
    assert tenants["trainer"].mode == "observe"
    assert tenants["trainer"].share_bytes == 30000 * MIB
    assert tenants["infer"].mode is None  # no GuardConfig: the node's mode
    assert tenants["nb"].mode == "off"
    assert all(t.mode is None for t in tenants_from(att))


def test_a_claims_plan_with_shares_or_shared_claims_is_guarded() -> None:
    """The guard's view reads nothing while no memory is shared; a claims plan shares it
    through a share, a claim meant for several pods, or a time-slicing/MPS strategy."""
    assert shares_memory(PLAN)
    exclusive = Plan(resources=(claim("a/x", SharingStrategy.NONE, dev("p/gpu-0", WHOLE)),))
    assert not shares_memory(exclusive)
    shared_by = Plan(resources=(claim("a/x", SharingStrategy.NONE, dev("p/gpu-0", WHOLE, 3)),))
    assert shares_memory(shared_by)
    mig_only = Plan(resources=(claim("a/x", SharingStrategy.NONE, dev("p/mig", MIG, 2)),))
    assert not shares_memory(mig_only)
