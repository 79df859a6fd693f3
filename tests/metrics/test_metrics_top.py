"""`gpuslice top` rendering: per GPU and per pod, with shares and unattributed processes."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gpuslice.core.cgroups import PodUid
from gpuslice.metrics.snapshot import SnapshotRefresher
from gpuslice.metrics.top import render_top
from gpuslice.ports import ContainerDevices
from tests.metrics.metrics_fixtures import (
    A100_MPS,
    HOST_DAEMON,
    INVENTORY,
    MPS,
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


class Books:
    def __init__(self, assignments: tuple[ContainerDevices, ...]) -> None:
        self.assignments = assignments

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        return self.assignments


def text_of(renderable: object) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def row(out: str, key: str) -> list[str]:
    line = next(line for line in out.splitlines() if key in line)
    return [cell.strip() for cell in line.split("│") if cell.strip()]


async def test_top_shows_gpus_pods_and_who_is_over_share(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    write_proc(tmp_path, 301, v2_systemd_containerd(uid(3), container_id(3)))
    write_proc(tmp_path, 50, HOST_DAEMON)
    backend = ScriptedBackend(
        gpu_statuses=default_statuses(),
        gpu_processes=[proc(101, T4, 5000, sm=80), proc(301, A100_MPS, 1000), proc(50, T4, 10)],
    )
    refresher = SnapshotRefresher(
        backend=backend,
        assignments=Books(
            (
                ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",)),
                ContainerDevices("ml", "mps-job", "main", MPS, (f"{A100_MPS}::0",)),
            )
        ),
        current=lambda: (build_plan(), INVENTORY),
        hostname="gpu-node-1",
        proc_root=tmp_path,
        pods=lambda: {PodUid(uid(1)): ("ml", "train"), PodUid(uid(3)): ("ml", "mps-job")},
        clock=lambda: 1000.0,
    )
    snap = await refresher.refresh()
    out = text_of(render_top(snap, now=1012.0))
    assert "gpu-node-1  snapshot 12s old" in out
    assert "Tesla T4" in out
    assert "3000 / 15360 MiB" in out
    # 5000 MiB used of a 3840 MiB fair share = 130 %; 80 % SM against a 25 % share.
    assert row(out, "ml/train") == [
        "0", "ml/train", "main", "time-slicing", "5000 MiB", "3840 MiB", "130%", "80", "25%",
        "101",
    ]  # fmt: skip
    # No SM sample for the MPS client: shown as unknown, not as 0.
    assert row(out, "ml/mps-job") == [
        "1", "ml/mps-job", "main", "mps", "1000 MiB", "40960 MiB", "2%", "-", "50%", "301",
    ]  # fmt: skip
    assert "pid 50 on " + T4 + ": not-in-a-pod" in out


def test_top_before_any_snapshot() -> None:
    assert "no metrics snapshot yet" in text_of(render_top(None))
