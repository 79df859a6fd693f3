"""Metrics and the memory guard's view on a unified-memory GPU (`sim:1xgb10`: NVML reports no
memory for it). Its telemetry has no framebuffer series (DCGM has none there either) and no
memory share to export or exceed, a pod's own memory use is still measured, and the guard
leaves the GPU out of its view (its tenants unwatched) saying so once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.core import Metric

from gpuslice.agent.guard_view import guard_view_reader
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.backends.simulated.nodespec import parse_spec
from gpuslice.core.cgroups import PodUid
from gpuslice.core.config.parsing import parse_config
from gpuslice.core.sharing.model import ResourceName
from gpuslice.core.sharing.plan import build_plan
from gpuslice.metrics import SnapshotCollector, SnapshotRefresher
from gpuslice.ports import ContainerDevices, GpuProcess
from tests.metrics.metrics_fixtures import container_id, uid, v2_systemd_containerd, write_proc

TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


class Books:
    def __init__(self, books: tuple[ContainerDevices, ...]) -> None:
        self.books = books

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        return self.books


def names(metrics: list[Metric]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for m in metrics:
        for s in m.samples:
            out.setdefault(s.name, []).append(s.value)
    return out


async def test_no_memory_series_nor_share_and_the_guard_leaves_the_gpu_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SimulatedBackend(parse_spec("1xgb10"))
    inventory = backend.inventory()
    (gpu,) = inventory.gpus
    plan = build_plan(inventory, parse_config(TS4))
    (resource,) = plan.resources
    device = resource.devices[0]
    books = (ContainerDevices("ml", "train", "main", ResourceName(resource.name), (device.id,)),)
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    backend.add_process(GpuProcess(101, gpu.uuid, 3000 * 2**20))
    current = lambda: (plan, inventory)  # noqa: E731
    shared = SnapshotRefresher(
        backend=backend,
        assignments=Books(books),
        current=current,
        hostname="n",
        proc_root=tmp_path,
        pods=lambda: {PodUid(uid(1)): ("ml", "train")},
    )
    read = guard_view_reader(backend, current, shared, tmp_path)
    try:
        view = await read()
        assert view is not None
        assert view.gpus == (), "no memory figure to hold a share against"
        (tenant,) = view.tenants  # attributed, but on no GPU the guard watches
        assert tenant.used_bytes == 3000 * 2**20
        await read()
        snap = shared.latest
        assert snap is not None
        series = names(list(SnapshotCollector(lambda: snap).collect()))
    finally:
        backend.close()
    assert "DCGM_FI_DEV_FB_USED" not in series
    assert "DCGM_FI_DEV_FB_FREE" not in series
    assert series["DCGM_FI_DEV_GPU_UTIL"] == [0]
    assert series["gpuslice_pod_memory_used_bytes"] == [3000 * 2**20]
    assert series["gpuslice_pod_entitled_sm_fraction"] == [0.25]
    assert "gpuslice_pod_entitled_memory_bytes" not in series
    assert "gpuslice_pod_memory_over_share" not in series
    assert caplog.text.count("guard-off-unified-memory") == 1, "told once, not at each poll"
