#!/usr/bin/env python3
"""Scrape cost of the per-GPU and per-pod metrics, as a ratio.

8 GPUs time-sliced 8 ways, 64 pods (one replica each), 256 GPU processes in a fake /proc
tree. Scrapes the exporter over HTTP and compares with a scrape of the same kind of
registry holding only the plugin's own counters (no snapshot yet), median of N each. The
ratio, not the absolute time, is the number to watch: a scrape only reads a snapshot, so it
should stay a small multiple of the baseline however slow NVML is.

    .venv/bin/python bench/bench_scrape.py [--rounds 200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpuslice.core.cgroups import PodUid
from gpuslice.core.devices import Gpu, GpuUuid, Inventory
from gpuslice.core.health import HealthEvent
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.core.units import MIB
from gpuslice.metrics import MetricsServer, SnapshotRefresher, exporter_registry
from gpuslice.ports import ContainerDevices, GpuProcess, GpuStatus

GPUS, REPLICAS, PROCS_PER_POD = 8, 8, 4
RESOURCE = ResourceName("nvidia.com/gpu.shared")
QUICK_ROUNDS = 20
"""`--quick`: enough scrapes for a median that shows the script works, not a measurement."""


def pod_uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def build() -> tuple[Plan, Inventory, tuple[ContainerDevices, ...]]:
    gpus = tuple(
        Gpu(i, GpuUuid(f"GPU-{i:08x}-0000-0000-0000-000000000000"), "NVIDIA H100 80GB HBM3",
            81559, 132, (9, 0), f"00000000:{i + 1:02x}:00.0", i)
        for i in range(GPUS)
    )  # fmt: skip
    devices = []
    for g in gpus:
        phys = PhysicalDevice(g.uuid, str(g.index), g.uuid, g.index, "gpu", g.product_name,
                              g.memory_mib, g.multiprocessors, g.minor)  # fmt: skip
        devices += [
            AdvertisedDevice(DeviceId(f"{g.uuid}::{r}"), phys, r, REPLICAS) for r in range(REPLICAS)
        ]
    plan = Plan(
        (ResourcePlan(RESOURCE, RESOURCE, SharingStrategy.TIME_SLICING, True, tuple(devices)),)
    )
    books = tuple(
        ContainerDevices("bench", f"pod-{i}", "main", RESOURCE, (d.id,))
        for i, d in enumerate(devices)
    )
    return plan, Inventory(gpus, "550.54.15", 12040), books


@dataclass
class Backend:
    inv: Inventory
    procs: tuple[GpuProcess, ...]

    @property
    def name(self) -> str:
        return "bench"

    def inventory(self) -> Inventory:
        return self.inv

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        return None

    def processes(self) -> tuple[GpuProcess, ...]:
        return self.procs

    def statuses(self) -> tuple[GpuStatus, ...]:
        return tuple(GpuStatus(g.uuid, 40000, 41559, 87, 40, 61, 400.0) for g in self.inv.gpus)

    def close(self) -> None:
        pass


class Books:
    def __init__(self, books: tuple[ContainerDevices, ...]) -> None:
        self.books = books

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        return self.books


def median_scrape_s(url: str, rounds: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as resp:
            size = len(resp.read())
        times.append(time.perf_counter() - start)
    return statistics.median(times), size


async def main(rounds: int) -> None:
    plan, inventory, books = build()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        procs = []
        for i, book in enumerate(books):
            gpu = book.device_ids[0].split("::")[0]
            for k in range(PROCS_PER_POD):
                pid = 1000 + i * PROCS_PER_POD + k
                (root / str(pid)).mkdir()
                u = pod_uid(i).replace("-", "_")
                (root / str(pid) / "cgroup").write_text(
                    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
                    f"cri-containerd-{i:064x}.scope\n"
                )
                procs.append(GpuProcess(pid, gpu, 512 * MIB, sm_util_percent=3))
        refresher = SnapshotRefresher(
            backend=Backend(inventory, tuple(procs)),
            assignments=Books(books),
            current=lambda: (plan, inventory),
            hostname="bench-node",
            proc_root=root,
            pods=lambda: {PodUid(pod_uid(i)): ("bench", f"pod-{i}") for i in range(len(books))},
        )
        start = time.perf_counter()
        snap = await refresher.refresh()
        refresh_s = time.perf_counter() - start
        attributed = sum(len(u.pids) for u in snap.attribution.usages)

        full_registry, _ = exporter_registry(lambda: refresher.latest)
        base_registry, _ = exporter_registry(lambda: None)
        async with (
            MetricsServer(full_registry, host="127.0.0.1") as full,
            MetricsServer(base_registry, host="127.0.0.1") as base,
        ):
            base_s, base_size = await asyncio.to_thread(median_scrape_s, base.url, rounds)
            full_s, full_size = await asyncio.to_thread(median_scrape_s, full.url, rounds)
    print(f"{GPUS} GPUs, {len(books)} pods, {len(procs)} processes ({attributed} attributed)")
    print(f"snapshot refresh (off the scrape path): {refresh_s * 1000:.1f} ms")
    print(f"baseline scrape (plugin counters only): {base_s * 1000:.2f} ms, {base_size} bytes")
    print(f"full scrape: {full_s * 1000:.2f} ms, {full_size} bytes (median of {rounds})")
    print(f"ratio full/baseline: {full_s / base_s:.2f}")
    print(
        f"Closing note: a scrape of the full exporter ({len(books)} pods on {GPUS} GPUs) costs "
        f"{full_s / base_s:.2f}x a scrape of the plugin's own counters (median of {rounds})."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=200, help="scrapes per median")
    parser.add_argument("--quick", action="store_true", help="20 rounds: a smoke run")
    args = parser.parse_args()
    asyncio.run(main(QUICK_ROUNDS if args.quick else args.rounds))
