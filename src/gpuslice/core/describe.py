"""`gpuslice describe`: what the node advertises and what one replica really gets.

Users of time-slicing and MPS repeatedly ask why a "GPU" in their pod behaves like a whole
card (time-slicing: no memory isolation) or reports the full memory (MPS: the limit is
enforced, not shown). This report states each share in words next to the hardware it
comes from, so that question is answered before the pod is scheduled.

The data is plain and frozen; `report_to_dict` gives JSON/YAML, the CLI renders tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.core.devices import Gpu, Inventory
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    MigStrategy,
    PhysicalDevice,
    Plan,
    ResourcePlan,
    SharingStrategy,
)


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


@dataclass(frozen=True, slots=True)
class DescribeReport:
    resources: tuple[tuple[str, int], ...]
    """(resource name, advertised device count), in plan order."""
    devices: tuple[GpuReport, ...]
    warnings: tuple[str, ...]
    mig_strategy: MigStrategy
    driver_version: str


def gib(mib: float) -> str:
    """MiB as GiB with three significant digits: 46068 -> `45`, 3840 -> `3.75`."""
    value = mib / 1024
    return f"{value:.0f}" if value >= 1000 else f"{value:.3g}"


def share_text(dev: AdvertisedDevice, strategy: SharingStrategy) -> str:
    phys = dev.physical
    if dev.replicas <= 1 or strategy == "none":
        return _mig_words(phys) if phys.kind == "mig" else "whole GPU"
    if strategy == "mps":
        pct = dev.mps.active_thread_percentage if dev.mps else 100 // dev.replicas
        limit = dev.mps.pinned_memory_limit_mib if dev.mps else phys.memory_mib // dev.replicas
        sms = phys.multiprocessors * pct // 100
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
    return (
        f"1/{dev.replicas} of the time{where}, no memory isolation, "
        f"{gib(phys.memory_mib / dev.replicas)} GiB if shared evenly"
    )


def _mig_words(phys: PhysicalDevice) -> str:
    return (
        f"{phys.profile}: {gib(phys.memory_mib)} GiB, {phys.multiprocessors} SMs, hardware-isolated"
    )


def _shares(resource: ResourcePlan, gpu: Gpu) -> list[ShareReport]:
    groups: dict[str, list[AdvertisedDevice]] = {}
    for dev in resource.devices:
        if dev.physical.gpu_uuid == gpu.uuid:
            groups.setdefault(dev.physical.uuid, []).append(dev)
    return [
        ShareReport(
            resource=resource.name,
            strategy=resource.strategy,
            device_uuid=devs[0].physical.uuid,
            device_index=devs[0].physical.index_id,
            replicas=len(devs),
            share=share_text(devs[0], resource.strategy),
            ids=tuple(d.id for d in devs),
        )
        for devs in groups.values()
    ]


def describe(plan: Plan, inventory: Inventory) -> DescribeReport:
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
            shares=tuple(s for r in plan.resources for s in _shares(r, gpu)),
        )
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
    )
    return DescribeReport(
        resources=tuple((r.name, len(r.devices)) for r in plan.resources),
        devices=gpus,
        warnings=plan.warnings,
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
                        "strategy": s.strategy,
                        "device": s.device_uuid,
                        "device_index": s.device_index,
                        "replicas": s.replicas,
                        "share": s.share,
                        "ids": list(s.ids),
                    }
                    for s in g.shares
                ],
            }
            for g in report.devices
        ],
        "warnings": list(report.warnings),
    }
