"""The memory guard's per-poll view: an idle node costs one process list, not a snapshot.

The guard polls every second. With no process on any GPU there is nobody to attribute or
stop, so the read must not refresh the shared snapshot (telemetry, the kubelet's
PodResources list, /proc); the first process makes the next poll read everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.agent.guard_view import IDLE_VIEW, guard_view_reader
from gpuslice.core.cgroups import PodUid
from gpuslice.core.sharing.model import Plan
from gpuslice.guard.enforcement import ReadView
from gpuslice.metrics import SnapshotRefresher
from gpuslice.ports import ContainerDevices, GpuProcess
from tests.metrics.metrics_fixtures import (
    INVENTORY,
    SHARED,
    T4,
    ScriptedBackend,
    build_plan,
    container_id,
    default_statuses,
    proc,
    uid,
    v2_systemd_containerd,
    write_proc,
)

PLAN = build_plan()
TRAIN = ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",))


@dataclass
class CountingAssignments:
    books: list[ContainerDevices] = field(default_factory=list)
    asked: int = 0

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        self.asked += 1
        return tuple(self.books)


class UnanswerableProcesses(ScriptedBackend):
    def processes(self) -> tuple[GpuProcess, ...]:
        raise RuntimeError("NVML: GPU is lost")


def reader(
    backend: ScriptedBackend, tmp_path: Path, plan: Plan = PLAN
) -> tuple[ReadView, SnapshotRefresher, CountingAssignments]:
    kubelet = CountingAssignments()
    pods = {PodUid(uid(1)): ("ml", "train")}
    shared = SnapshotRefresher(
        backend=backend,
        assignments=kubelet,
        current=lambda: (plan, INVENTORY),
        hostname="n",
        proc_root=tmp_path,
        pods=lambda: pods,
    )
    return guard_view_reader(backend, lambda: (plan, INVENTORY), shared, tmp_path), shared, kubelet


async def test_idle_node_reads_the_process_list_only(tmp_path: Path) -> None:
    backend = ScriptedBackend(gpu_statuses=default_statuses())
    read, shared, kubelet = reader(backend, tmp_path)
    for _ in range(3):
        assert await read() is IDLE_VIEW
    assert shared.latest is None
    assert kubelet.asked == 0


async def test_a_gpu_process_makes_the_next_poll_read_everything(tmp_path: Path) -> None:
    backend = ScriptedBackend(gpu_statuses=default_statuses())
    read, shared, kubelet = reader(backend, tmp_path)
    assert await read() is IDLE_VIEW
    kubelet.books.append(TRAIN)
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    backend.gpu_processes = [proc(101, T4, 5000)]
    view = await read()
    assert view is not None
    assert kubelet.asked == 1
    assert shared.latest is not None
    [tenant] = view.tenants
    assert (tenant.key.pod, tenant.pids, tenant.used_bytes) == ("train", (101,), 5000 * 2**20)
    assert set(view.identities) == {101}
    assert {g.uuid for g in view.gpus} >= {T4}

    backend.gpu_processes = []  # the pod's process ended: back to the cheap read
    assert await read() is IDLE_VIEW
    assert kubelet.asked == 1


async def test_a_backend_that_cannot_list_processes_gets_the_full_read(tmp_path: Path) -> None:
    backend = UnanswerableProcesses(gpu_statuses=default_statuses())
    read, shared, _kubelet = reader(backend, tmp_path)
    view = await read()
    assert view is not None
    assert view is not IDLE_VIEW
    assert shared.latest is not None
    assert any("GPU is lost" in p for p in shared.latest.problems)


async def test_a_plan_without_time_slicing_or_mps_is_not_guarded(tmp_path: Path) -> None:
    backend = ScriptedBackend(gpu_statuses=default_statuses())
    backend.gpu_processes = [proc(101, T4, 5000)]
    exclusive = Plan(
        resources=tuple(r for r in PLAN.resources if r.strategy not in ("time-slicing", "mps")),
        mig_strategy=PLAN.mig_strategy,
    )
    read, shared, _kubelet = reader(backend, tmp_path, exclusive)
    assert await read() is None
    assert shared.latest is None
