"""Hand-made inventories and plans, and a running node: PlanState + plugins + emulated kubelet."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuslice.core.devices import Gpu, GpuUuid, Inventory
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    AllocateSettings,
    DeviceId,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
    replica_id,
)
from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.kubelet.manager import DevicePluginManager, ManagerSettings
from gpuslice.kubelet.registration import Backoff
from gpuslice.logs import get_logger
from gpuslice.state import PlanState

FAST = ManagerSettings(
    watch_interval_s=0.05,
    stop_grace_s=1.0,
    register_backoff=Backoff(initial_s=0.05, maximum_s=0.2),
    start_backoff=Backoff(initial_s=0.05, maximum_s=0.2),
)
"""Short poll and retry delays so tests react in milliseconds."""


def gpu(index: int, *, numa: int | None = None) -> Gpu:
    return Gpu(
        index=index,
        uuid=GpuUuid(f"GPU-{index:08x}-aaaa-bbbb-cccc-dddddddddddd"),
        product_name="Tesla T4",
        memory_mib=15360,
        multiprocessors=40,
        compute_capability=(7, 5),
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
        minor=index,
        numa_node=numa,
    )


def inventory(gpus: Sequence[Gpu]) -> Inventory:
    return Inventory(gpus=tuple(gpus), driver_version="550.54.15", cuda_driver_version=12040)


def physical(g: Gpu) -> PhysicalDevice:
    return PhysicalDevice.of_gpu(g)


def whole(gpus: Sequence[Gpu], name: str = "nvidia.com/gpu") -> ResourcePlan:
    return ResourcePlan(
        name=ResourceName(name),
        label_name=ResourceName(name),
        strategy=SharingStrategy.NONE,
        fail_requests_greater_than_one=False,
        devices=tuple(AdvertisedDevice(DeviceId(g.uuid), physical(g), None, 1) for g in gpus),
    )


def shared(
    gpus: Sequence[Gpu],
    replicas: int,
    name: str = "nvidia.com/gpu",
    *,
    strategy: SharingStrategy = SharingStrategy.TIME_SLICING,
    fail_over_one: bool = True,
) -> ResourcePlan:
    return ResourcePlan(
        name=ResourceName(name),
        label_name=ResourceName("nvidia.com/gpu"),
        strategy=strategy,
        fail_requests_greater_than_one=fail_over_one,
        devices=tuple(
            AdvertisedDevice(replica_id(g.uuid, n), physical(g), n, replicas)
            for g in gpus
            for n in range(replicas)
        ),
    )


def plan(*resources: ResourcePlan, allocate: AllocateSettings | None = None) -> Plan:
    return Plan(resources=resources, allocate=allocate or AllocateSettings())


@dataclass(slots=True)
class Node:
    state: PlanState
    kubelet: KubeletEmulator
    manager: DevicePluginManager
    plugin_dir: Path
    stop: asyncio.Event


@contextlib.asynccontextmanager
async def running_node(
    plugin_dir: Path,
    first_plan: Plan,
    inv: Inventory,
    *,
    register: bool = True,
    kubelet_first: bool = True,
    settings: ManagerSettings = FAST,
) -> AsyncIterator[Node]:
    """The plugins and the emulated kubelet in this event loop; everything stopped after."""
    state = PlanState(first_plan, inv)
    kubelet = KubeletEmulator(plugin_dir)
    if kubelet_first:
        await kubelet.start()
    manager = DevicePluginManager(
        state,
        plugin_dir=plugin_dir,
        kubelet_socket=plugin_dir / "kubelet.sock" if register else None,
        logger=get_logger("gpuslice.test.kubelet"),
        dev_nodes_probe=frozenset,
        settings=settings,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop), name="test-device-plugins")
    try:
        yield Node(state, kubelet, manager, plugin_dir, stop)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
