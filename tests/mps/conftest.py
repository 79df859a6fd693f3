"""Fixtures for the MPS tests: plans shaped like real nodes, and the fake control program."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslice.core.devices import GpuUuid
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    MpsShare,
    PhysicalDevice,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
    replica_id,
)
from gpuslice.mps import MpsDaemonManager

FAKE_CONTROL = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")

L40S_MIB = 46068
"""What NVML reports for an L40S (NVIDIA/k8s-device-plugin#764 shows 4606M for 10 replicas)."""


def gpu(index: int, memory_mib: int = L40S_MIB, name: str = "NVIDIA L40S") -> PhysicalDevice:
    return PhysicalDevice(
        uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        index_id=str(index),
        gpu_uuid=GpuUuid(f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000"),
        gpu_index=index,
        kind="gpu",
        product_name=name,
        memory_mib=memory_mib,
        multiprocessors=142,
        minor=index,
    )


def shared(
    gpus: list[PhysicalDevice],
    replicas: int,
    *,
    name: str = "nvidia.com/gpu",
    strategy: SharingStrategy = SharingStrategy.MPS,
    with_share: bool = True,
) -> ResourcePlan:
    """A replicated resource as the planner builds it: the share is NVIDIA's arithmetic."""
    devices = tuple(
        AdvertisedDevice(
            id=replica_id(g.uuid, n),
            physical=g,
            replica=n,
            replicas=replicas,
            mps=MpsShare(100 // replicas, g.memory_mib // replicas) if with_share else None,
        )
        for g in gpus
        for n in range(replicas)
    )
    return ResourcePlan(
        name=ResourceName(name),
        label_name=ResourceName(name),
        strategy=strategy,
        fail_requests_greater_than_one=True,
        devices=devices,
    )


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _children_reaped() -> Iterator[None]:
    """Every control-program invocation must have been waited for when a test ends."""
    before = set(_children_of(os.getpid()))
    yield
    left = set(_children_of(os.getpid())) - before
    assert not left, f"child processes left behind (running or unreaped): {sorted(left)}"


async def wait_until(
    manager: MpsDaemonManager, condition: Callable[[], bool], within_s: float
) -> None:
    """Follow the readiness signal until `condition` holds; fail after `within_s`."""

    async def follow() -> None:
        version = manager.version
        while not condition():
            version = await manager.wait_changed(version)

    await asyncio.wait_for(follow(), within_s)
