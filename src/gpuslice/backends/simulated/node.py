"""Turning a node spec into the inventory NVML would report for it.

Identities are derived, not random, so a simulated node looks the same on every run: logs,
replica IDs and test expectations stay stable. Topology follows common server layouts:
more than four GPUs split over two NUMA nodes; SXM parts sit on an NVSwitch baseboard
(every pair linked with all of each GPU's NVLinks) when there are more than four of them,
or in a direct mesh (links shared among peers, e.g. 4 per pair on a 4-GPU A100 board).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from itertools import combinations

from gpuslice.backends.simulated.layout import place
from gpuslice.backends.simulated.nodespec import GpuGroup, NodeSpec
from gpuslice.core.devices import Gpu, GpuUuid, Inventory, Link, MigDevice, P2PLevel
from gpuslice.ports import BackendError


def derived_uuid(prefix: str, seed: str) -> str:
    """`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a hash of `seed`."""
    h = hashlib.sha256(seed.encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def pci_bus_id(index: int) -> str:
    # Spread over the bus space like real servers do (07, 0f, 17, ...); MAX_GPUS keeps it < 256.
    return f"00000000:{0x07 + 8 * index:02X}:00.0"


def pcie_root(index: int) -> str:
    """The root complex a simulated GPU hangs under: two GPUs per root, as on servers
    that put a pair of GPUs (and their NICs) behind one PCIe switch per root port (DGX
    H100/A100 style). Its bus is at or below both GPUs' buses (07 and 0f under 00, 17 and
    1f under 10), as the hierarchy requires."""
    return f"pci0000:{0x10 * (index // 2):02x}"


def build_inventory(spec: NodeSpec) -> Inventory:
    total = sum(g.count for g in spec.groups)
    gpus: list[Gpu] = []
    for group in spec.groups:
        for _ in range(group.count):
            gpus.append(_gpu(group, len(gpus), total))
    seen: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen:
            raise BackendError(f"simulated node {spec.source}: UUID {gpu.uuid} is used twice")
        seen.add(gpu.uuid)
    return Inventory(
        gpus=tuple(gpus),
        driver_version=spec.driver_version,
        cuda_driver_version=spec.cuda_driver_version,
        links=_links(spec, gpus),
        machine_type=spec.machine_type,
    )


def rebuild_gpu(spec: NodeSpec, index: int, *, mig_enabled: bool, mig_layout: str | None) -> Gpu:
    """GPU `index` of the node after its MIG mode or layout changed (as after `nvidia-smi
    -mig 1` and a reset, or `nvidia-smi mig -cgi ... -C`): same identity, new MIG devices.
    BackendError when the model has no MIG or the layout does not fit."""
    total = sum(g.count for g in spec.groups)
    first = 0
    for group in spec.groups:
        if first <= index < first + group.count:
            if not group.model.mig_capable and mig_enabled:
                raise BackendError(f"GPU {index} ({group.model.product_name}) does not support MIG")
            changed = dataclasses.replace(
                group,
                mig_enabled=mig_enabled,
                mig_layout=mig_layout if mig_enabled else None,
                mig_pending=None,
            )
            return _gpu(changed, index, total)
        first += group.count
    raise BackendError(f"no GPU index {index}: this node has indices 0..{total - 1}")


def _gpu(group: GpuGroup, index: int, total: int) -> Gpu:
    model = group.model
    uuid = GpuUuid(group.uuid or derived_uuid("GPU", f"{model.key}:{index}"))
    numa = group.numa
    if numa is None:
        numa = 1 if total > 4 and index >= total // 2 else 0
    mig_devices: tuple[MigDevice, ...] = ()
    if group.mig_enabled and group.mig_layout is not None:
        placed = place(group.mig_layout, model)
        mig_devices = tuple(
            p.profile.device(
                uuid=derived_uuid("MIG", f"{uuid}/{p.gi_id}/{p.ci_id}/{p.profile.name}@{p.start}"),
                parent_uuid=uuid,
                parent_index=index,
                parent_minor=index,  # a simulated GPU's minor is its index
                index=j,
                gi_id=p.gi_id,
                ci_id=p.ci_id,
                start=p.start,
            )
            for j, p in enumerate(placed)
        )
    return Gpu(
        index=index,
        uuid=uuid,
        product_name=model.product_name,
        memory_mib=model.memory_mib,
        multiprocessors=model.multiprocessors,
        compute_capability=model.compute_capability,
        pci_bus_id=pci_bus_id(index),
        minor=index,
        numa_node=numa,
        pcie_root=pcie_root(index),
        mig_capable=model.mig_capable,
        mig_enabled=group.mig_enabled,
        mig_pending=group.mig_enabled if group.mig_pending is None else group.mig_pending,
        mig_devices=mig_devices,
        pci_device_id=model.pci_device_id,
        pci_class=model.pci_class,
        mig_geometry=model.mig,
    )


def _links(spec: NodeSpec, gpus: list[Gpu]) -> tuple[Link, ...]:
    models = [g.model for g in spec.groups for _ in range(g.count)]
    per_model = Counter(m.key for m in models)
    links: list[Link] = []
    for a, b in combinations(gpus, 2):
        p2p: P2PLevel = "same-cpu" if a.numa_node == b.numa_node else "cross-cpu"
        ma, mb = models[a.index], models[b.index]
        nvlinks = 0
        if ma.key == mb.key and ma.nvlinks:
            peers = per_model[ma.key] - 1
            nvlinks = ma.nvlinks if peers > 3 else ma.nvlinks // peers
        links.append(Link(a=a.uuid, b=b.uuid, p2p=p2p, nvlinks=nvlinks))
    return tuple(links)
