"""`gpuslice describe`: what the node advertises and what one replica really gets.

Users of time-slicing and MPS repeatedly ask why a "GPU" in their pod behaves like a whole
card (time-slicing: no memory isolation) or reports the full memory (MPS: the limit is
enforced, not shown). This report states each share in words next to the hardware it
comes from, so that question is answered before the pod is scheduled.

The data is plain and frozen; `report_to_dict` gives JSON/YAML, the CLI renders tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.core.devices import Gpu, Inventory
from gpuslice.core.policy import DeviceEntitlement, NodePolicy
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    Isolation,
    MigStrategy,
    PhysicalDevice,
    Plan,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.core.units import MIB


@dataclass(frozen=True, slots=True)
class MigReport:
    uuid: str
    index_id: str
    profile: str
    memory_mib: int
    multiprocessors: int


@dataclass(frozen=True, slots=True)
class ShareReport:
    """One resource's devices on one physical device (a whole GPU or a MIG device)."""

    resource: str
    strategy: SharingStrategy
    device_uuid: str
    device_index: str
    replicas: int
    share: str
    """What one advertised device gets, in words."""
    ids: tuple[str, ...]
    isolation: Isolation = "none"
    """What keeps this replica's work apart from other pods' on the same hardware: `mig`
    (an unshared MIG device), `mps` (an MPS daemon's limits), `none` (time-slicing, or a
    whole GPU that nothing else uses)."""
    sm_share: float = 1.0
    """Fraction of the device's SMs: 1/replicas of the time under time-slicing, the active
    thread percentage / 100 under MPS, 1 when not shared."""
    active_thread_percentage: int | None = None
    """MPS only: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for one replica."""
    memory_mib: int = 0
    """Memory for one replica: MPS's pinned limit, an even share under time-slicing, the
    whole device when not shared."""
    memory_enforced: bool = True
    """False under time-slicing: the even share is a convention, not a limit."""


@dataclass(frozen=True, slots=True)
class GpuReport:
    index: int
    uuid: str
    product: str
    memory_mib: int
    multiprocessors: int
    mig_enabled: bool
    mig_devices: tuple[MigReport, ...]
    shares: tuple[ShareReport, ...]
    protection: str = ""
    """What holds this GPU's shared tenants to their memory: `capped` (the driver's limits),
    `guarded` (the memory guard), `none`; "" when not asked (`core.caps.Protection`)."""
    protection_reason: str = ""
    """Why it is not capped, in words; "" when it is."""


@dataclass(frozen=True, slots=True)
class DescribeReport:
    resources: tuple[tuple[str, int], ...]
    """(resource name, advertised device count), in plan order."""
    devices: tuple[GpuReport, ...]
    warnings: tuple[str, ...]
    mig_strategy: MigStrategy
    driver_version: str


UNIFIED_MEMORY_WORDS = "unified memory: NVML reports no GPU memory figure"


def unified_memory_note(gpu: Gpu) -> str:
    """Why the memory features are off on a GPU whose memory NVML does not report: said once
    per GPU by `describe` and logged once by the agent, so an operator is not left to guess
    why a GB10 or Jetson Thor node has no memory label, capacity, MPS limit or guard."""
    return (
        f"GPU {gpu.index} ({gpu.product_name}, {gpu.uuid}): {UNIFIED_MEMORY_WORDS}; it is "
        "shared by count only: no nvidia.com/gpu.memory label, no DRA memory capacity nor "
        "shares by memory, no MPS pinned memory limit, no memory guard, no memory metrics"
    )


def gib(mib: float) -> str:
    """MiB as GiB with three significant digits: 46068 -> `45`, 3840 -> `3.75`."""
    value = mib / 1024
    return f"{value:.0f}" if value >= 1000 else f"{value:.3g}"


def _mps_share(entry: DeviceEntitlement) -> tuple[int, int]:
    """An MPS replica's thread percentage and pinned memory limit in MiB (0: none), as the
    plan snapshot's table holds them."""
    assert entry.thread_percentage is not None  # the table gives every MPS replica one
    return entry.thread_percentage, entry.each.memory_bytes // MIB


def share_text(dev: AdvertisedDevice, strategy: SharingStrategy, entry: DeviceEntitlement) -> str:
    phys = dev.physical
    if dev.replicas <= 1 or strategy == SharingStrategy.NONE:
        return _mig_words(phys) if phys.kind == "mig" else "whole GPU"
    if strategy == SharingStrategy.MPS:
        pct, limit = _mps_share(entry)
        sms = phys.multiprocessors * pct // 100
        if not phys.memory_reported:
            return (
                f"{pct}% of SMs ({sms} of {phys.multiprocessors}), no pinned memory limit "
                f"({UNIFIED_MEMORY_WORDS})"
            )
        return (
            f"{pct}% of SMs ({sms} of {phys.multiprocessors}), pinned memory limit {limit} MiB; "
            f"total_memory inside the pod still reports the whole GPU ({gib(phys.memory_mib)} "
            "GiB): the limit is enforced by MPS, not shown by CUDA"
        )
    where = (
        f" of MIG {phys.profile} ({gib(phys.memory_mib)} GiB, {phys.multiprocessors} SMs)"
        if phys.kind == "mig"
        else ""
    )
    if not phys.memory_reported:
        return f"1/{dev.replicas} of the time, no memory isolation ({UNIFIED_MEMORY_WORDS})"
    return (
        f"1/{dev.replicas} of the time{where}, no memory isolation, "
        f"{gib(phys.memory_mib / dev.replicas)} GiB if shared evenly"
    )


def _mig_words(phys: PhysicalDevice) -> str:
    return (
        f"{phys.profile}: {gib(phys.memory_mib)} GiB, {phys.multiprocessors} SMs, hardware-isolated"
    )


@dataclass(frozen=True, slots=True)
class _Numbers:
    isolation: Isolation
    sm_share: float
    active_thread_percentage: int | None
    memory_mib: int
    memory_enforced: bool


def share_numbers(
    dev: AdvertisedDevice, strategy: SharingStrategy, entry: DeviceEntitlement
) -> _Numbers:
    """`share_text` as fields, for scripts (`describe -o json`). A time-sliced replica's
    memory is the device's / N "if shared evenly", on a MIG device too, where attribution
    counts each replica as holding the MIG device whole (`entitlement_of`)."""
    phys = dev.physical
    if strategy == SharingStrategy.MPS:
        pct, limit = _mps_share(entry)
        return _Numbers(strategy.isolation, pct / 100, pct, limit, bool(limit))
    if dev.replicas <= 1 or strategy == SharingStrategy.NONE:
        held = SharingStrategy.MIG if phys.kind == "mig" else SharingStrategy.NONE
        return _Numbers(held.isolation, 1.0, None, phys.memory_mib, True)
    return _Numbers(
        strategy.isolation, 1 / dev.replicas, None, phys.memory_mib // dev.replicas, False
    )


def _shares(
    resource: ResourcePlan, gpu: Gpu, entitlements: Mapping[str, DeviceEntitlement]
) -> list[ShareReport]:
    groups: dict[str, list[AdvertisedDevice]] = {}
    for dev in resource.devices:
        if dev.physical.gpu_uuid == gpu.uuid:
            groups.setdefault(dev.physical.uuid, []).append(dev)
    out = []
    for devs in groups.values():
        entry = entitlements[devs[0].physical.uuid]
        numbers = share_numbers(devs[0], resource.strategy, entry)
        out.append(
            ShareReport(
                resource=resource.name,
                strategy=resource.strategy,
                device_uuid=devs[0].physical.uuid,
                device_index=devs[0].physical.index_id,
                replicas=len(devs),
                share=share_text(devs[0], resource.strategy, entry),
                ids=tuple(d.id for d in devs),
                isolation=numbers.isolation,
                sm_share=numbers.sm_share,
                active_thread_percentage=numbers.active_thread_percentage,
                memory_mib=numbers.memory_mib,
                memory_enforced=numbers.memory_enforced,
            )
        )
    return out


def describe(
    plan: Plan,
    inventory: Inventory,
    protection: Mapping[str, tuple[str, str]] | None = None,
) -> DescribeReport:
    """`protection`: GPU UUID -> (protection, why not capped), `core.caps.caps_view`'s. The
    shares' figures are the plan's policy table's (`core.policy.NodePolicy`), as the daemon
    builds it for the same plan."""
    guarded = protection or {}
    entitlements = NodePolicy(plan, inventory).entitlements
    gpus = tuple(
        GpuReport(
            index=gpu.index,
            uuid=gpu.uuid,
            product=gpu.product_name,
            memory_mib=gpu.memory_mib,
            multiprocessors=gpu.multiprocessors,
            mig_enabled=gpu.mig_enabled,
            mig_devices=tuple(
                MigReport(m.uuid, m.index_id, m.profile, m.memory_mib, m.multiprocessors)
                for m in gpu.mig_devices
            ),
            shares=tuple(s for r in plan.resources for s in _shares(r, gpu, entitlements)),
            protection=guarded.get(gpu.uuid, ("", ""))[0],
            protection_reason=guarded.get(gpu.uuid, ("", ""))[1],
        )
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
    )
    return DescribeReport(
        resources=tuple((r.name, len(r.devices)) for r in plan.resources),
        devices=gpus,
        warnings=(
            *plan.warnings,
            *(unified_memory_note(g) for g in inventory.gpus if not g.memory_reported),
        ),
        mig_strategy=plan.mig_strategy,
        driver_version=inventory.driver_version,
    )


def report_to_dict(report: DescribeReport) -> dict[str, object]:
    """Plain JSON/YAML-safe data: str keys, lists, ints, strings."""
    return {
        "driver_version": report.driver_version,
        "mig_strategy": report.mig_strategy,
        "resources": dict(report.resources),
        "devices": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "product": g.product,
                "memory_mib": g.memory_mib,
                "memory": f"{gib(g.memory_mib)} GiB",
                "multiprocessors": g.multiprocessors,
                "mig_enabled": g.mig_enabled,
                "memory_protection": g.protection or None,
                "memory_protection_reason": g.protection_reason or None,
                "mig_devices": [
                    {
                        "uuid": m.uuid,
                        "index": m.index_id,
                        "profile": m.profile,
                        "memory_mib": m.memory_mib,
                        "memory": f"{gib(m.memory_mib)} GiB",
                        "multiprocessors": m.multiprocessors,
                    }
                    for m in g.mig_devices
                ],
                "resources": [
                    {
                        "resource": s.resource,
                        "strategy": str(s.strategy),
                        "device": s.device_uuid,
                        "device_index": s.device_index,
                        "replicas": s.replicas,
                        "share": s.share,
                        "isolation": s.isolation,
                        "sm_share": round(s.sm_share, 6),
                        "active_thread_percentage": s.active_thread_percentage,
                        "memory_mib": s.memory_mib,
                        "memory_enforced": s.memory_enforced,
                        "ids": list(s.ids),
                    }
                    for s in g.shares
                ],
            }
            for g in report.devices
        ],
        "warnings": list(report.warnings),
    }
