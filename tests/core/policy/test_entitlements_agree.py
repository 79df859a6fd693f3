"""The policy table's entitlements (`core.policy.NodePolicy.entitlements`) are what every
reader holds a replica or a share to: the exporter's entitled memory and SM fraction, the
guard's share (to the byte), `describe`'s numbers and Allocate's memory (the hook's pair,
MPS's limits: whole MiB, rounded down), on a GPU with memory and on a unified-memory one;
and a DRA share that asked for no memory is entitled, through Prepare's record and the
claims plan, to the default the slice published (`ShareOffer.default_memory_mib`). Pure:
simulated inventories, no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.backends import open_backend
from gpuslice.core.allocation.caps import AllocateCaps
from gpuslice.core.allocation.response import build_allocation
from gpuslice.core.attribution import Attribution, attribute
from gpuslice.core.caps import GpuCapability
from gpuslice.core.config import parse_config
from gpuslice.core.describe import describe
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.claimplan import claims_plan
from gpuslice.core.dra.preparation import preparation
from gpuslice.core.dra.prepared import PreparedClaim
from gpuslice.core.dra.publish import REPLICAS, SharesMode
from gpuslice.core.guard import tenants_from
from gpuslice.core.mps import daemon_spec
from gpuslice.core.policy import DeviceEntitlement, NodePolicy
from gpuslice.core.protection import guard_tenants
from gpuslice.core.sharing.model import AllocateSettings, Plan, SharingStrategy
from gpuslice.core.sharing.plan import build_plan
from gpuslice.core.units import MIB, whole_mib
from gpuslice.metrics.collector import SnapshotCollector
from gpuslice.metrics.snapshot import GpuSample, MetricsSnapshot
from gpuslice.ports import ContainerDevices, GpuStatus
from tests.core.dra.share_claims import unrecorded_share

SHARED = """\
version: v1
sharing:
  {strategy}:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
NORMAL = "sim:1xh100-80gb"
UNIFIED = "sim:1xgb10"
CDI = AllocateSettings(device_list_strategies=("cdi-cri",))
DRIVER = "gpu.nvidia.com"
POOL = "n1"


def inventory_of(node: str) -> Inventory:
    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


def exported(attribution: Attribution, inventory: Inventory) -> dict[str, float]:
    """The exporter's per-pod series of the one holder, by name."""
    status = GpuStatus(inventory.gpus[0].uuid, None, None, None, None, None, None)
    snap = MetricsSnapshot(
        taken_at=1.0,
        hostname="n1",
        gpus=tuple(
            GpuSample(g.index, g.uuid, g.product_name, g.memory_mib, status) for g in inventory.gpus
        ),
        attribution=attribution,
        advertised={},
        allocated={},
    )
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snap))
    text = generate_latest(registry).decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("gpuslice_pod_entitled")
    }


def table_of(node: str, strategy: str) -> tuple[Inventory, Plan, DeviceEntitlement]:
    inventory = inventory_of(node)
    plan = build_plan(inventory, parse_config(SHARED.format(strategy=strategy)))
    (entry,) = NodePolicy(plan, inventory).entitlements.values()
    return inventory, plan, entry


@pytest.mark.parametrize("node", [NORMAL, UNIFIED])
@pytest.mark.parametrize("strategy", ["timeSlicing", "mps"])
def test_every_reader_holds_a_replica_to_the_tables_entitlement(node: str, strategy: str) -> None:
    inventory, plan, entry = table_of(node, strategy)
    gpu = inventory.gpus[0]
    (resource,) = plan.resources
    replica = resource.devices[0]
    each = entry.each
    # the table itself: a quarter of the memory (none on unified memory), a quarter of the
    # SMs; a time-sliced quarter to the byte, an MPS one to the MiB its daemon is given
    assert each.memory_bytes // MIB == gpu.memory_mib // 4
    assert each.sm_fraction == pytest.approx(0.25)
    assert entry.thread_percentage == (25 if strategy == "mps" else None)
    assert entry.cappable == (strategy == "timeSlicing" and gpu.memory_reported)

    # the exporter and the guard, for a container holding one replica
    held = ContainerDevices("ns", "p", "c", resource.name, (replica.id,))
    attribution = attribute([held], plan, [], {}, inventory=inventory)
    series = exported(attribution, inventory)
    assert series["gpuslice_pod_entitled_sm_fraction"] == pytest.approx(each.sm_fraction)
    if gpu.memory_reported:
        assert series["gpuslice_pod_entitled_memory_bytes"] == each.memory_bytes
    else:  # no memory figure: no memory share exported
        assert "gpuslice_pod_entitled_memory_bytes" not in series
    (tenant,) = guard_tenants(attribution, plan)
    assert tenant.share_bytes == each.memory_bytes == tenants_from(attribution)[0].share_bytes

    # describe
    (share,) = describe(plan, inventory).devices[0].shares
    assert share.memory_mib == each.memory_bytes // MIB
    assert share.sm_share == pytest.approx(each.sm_fraction)
    assert share.active_thread_percentage == entry.thread_percentage

    # Allocate
    caps = AllocateCaps(
        {gpu.uuid: GpuCapability(gpu.uuid)},
        entitlements=NodePolicy(plan, inventory).entitlements,
    )
    envs = dict(build_allocation(resource, CDI, [replica.id], annotation_id="x", caps=caps).envs)
    if entry.cappable:
        request = str(each.memory_bytes // MIB)
        assert envs["NVIDIA_GPU_MEMORY_REQUEST"] == envs["NVIDIA_GPU_MEMORY_LIMIT"] == request
    else:
        assert "NVIDIA_GPU_MEMORY_REQUEST" not in envs
    if strategy == "mps":
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(entry.thread_percentage)
        pinned = envs.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
        assert pinned == (f"0={each.memory_bytes // MIB}M" if gpu.memory_reported else None)


def test_two_replicas_are_capped_to_twice_the_tables_entitlement() -> None:
    inventory, plan, entry = table_of(NORMAL, "timeSlicing")
    (resource,) = plan.resources
    gpu = inventory.gpus[0]
    caps = AllocateCaps(
        {gpu.uuid: GpuCapability(gpu.uuid)},
        "borrow",
        entitlements=NodePolicy(plan, inventory).entitlements,
    )
    ids = [d.id for d in resource.devices[:2]]
    envs = dict(build_allocation(resource, CDI, ids, annotation_id="x", caps=caps).envs)
    limits = entry.limits("borrow", 2)
    assert limits is not None
    assert envs["NVIDIA_GPU_MEMORY_REQUEST"] == str(limits.soft_bytes // MIB)
    assert limits.soft_bytes == whole_mib(2 * entry.each.memory_bytes)  # the hook's grain
    assert envs["NVIDIA_GPU_MEMORY_LIMIT"] == str(gpu.memory_mib)


@pytest.mark.parametrize("node", [NORMAL, UNIFIED])
@pytest.mark.parametrize(
    ("mode", "config"),
    [
        (REPLICAS, SHARED.format(strategy="timeSlicing")),
        (SharesMode("count", 4), "version: v1\n"),
    ],
)
def test_a_dra_share_that_asked_nothing_is_held_to_the_published_default(
    node: str, mode: SharesMode, config: str
) -> None:
    inventory = inventory_of(node)
    gpu = inventory.gpus[0]
    plan = build_plan(inventory, parse_config(config))
    offer = NodePolicy(plan, inventory).offer(mode)
    (device,) = offer.devices
    work = unrecorded_share(device.name, offer.by_name(), offer.offers_by_name())
    uses = preparation(work, "/mps").uses
    prepared = PreparedClaim("uid-1", "ns", "c", "PrepareCompleted", uses=uses)
    claims = claims_plan([prepared], inventory, POOL)
    (resource,) = claims.resources
    held = ContainerDevices("ns", "p", "c", resource.name, tuple(d.id for d in resource.devices))
    attribution = attribute([held], claims, [], {}, inventory=inventory)
    default = offer.shares[gpu.uuid].default_memory_mib * MIB
    assert default == (gpu.memory_mib // 4 * MIB if mode == REPLICAS else 0)
    (usage,) = attribution.usages
    assert usage.entitlement.kind is SharingStrategy.TIME_SLICING
    assert usage.entitlement.memory_bytes == default
    (tenant,) = guard_tenants(attribution, claims)
    assert tenant.share_bytes == default
    series = exported(attribution, inventory)
    assert series.get("gpuslice_pod_entitled_memory_bytes") == (
        default if gpu.memory_reported else None
    )


def test_an_mps_replica_handed_without_its_share_gets_the_even_one_everywhere() -> None:
    """A hand-built plan's MPS replica without `mps`: the table, the MPS daemon and both of
    `describe`'s forms take the even share (`MpsShare.even`); describe's JSON said 100% and
    the whole memory while its text said 25%."""
    inventory, plan, _ = table_of(NORMAL, "mps")
    (resource,) = plan.resources
    bare = replace(resource, devices=tuple(replace(d, mps=None) for d in resource.devices))
    plan = replace(plan, resources=(bare,))
    gpu = inventory.gpus[0]
    (entry,) = NodePolicy(plan, inventory).entitlements.values()
    assert entry.thread_percentage == 25
    assert entry.each.memory_bytes == gpu.memory_mib // 4 * MIB
    (share,) = describe(plan, inventory).devices[0].shares
    assert (share.active_thread_percentage, share.memory_mib) == (25, gpu.memory_mib // 4)
    assert share.share.startswith("25% of SMs")
    spec = daemon_spec(bare, "/mps")
    assert spec is not None
    assert spec.active_thread_percentage == 25
    assert spec.pinned_mem_limits_mib == ((gpu.index, gpu.memory_mib // 4),)
