"""The exporter end to end: scripted backend + PodResources emulator + fake /proc,
scraped over HTTP on port 0, checked by promtool and by prometheus_client's parser."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.core.cgroups import PodUid
from gpuslice.core.units import MIB
from gpuslice.metrics import MetricsServer, SnapshotRefresher, exporter_registry
from gpuslice.podresources import PodResourcesClient, PodResourcesEmulator
from gpuslice.ports import ContainerDevices
from gpuslice.testing.eventually import eventually
from tests.metrics.metrics_fixtures import (
    A100_MIG,
    A100_MPS,
    INVENTORY,
    L40S,
    MIG_1G,
    MIG_1G_RES,
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

PLAN = build_plan()
TRAIN = ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",))
MPS_JOB = ContainerDevices("ml", "mps-job", "main", MPS, (f"{A100_MPS}::1",))
MIG_JOB = ContainerDevices("lab", "tiny", "nb", MIG_1G_RES, (MIG_1G,))


@dataclass
class Node:
    backend: ScriptedBackend
    books: list[ContainerDevices]
    pods: dict[PodUid, tuple[str, str]]
    refresher: SnapshotRefresher
    server: MetricsServer
    emulator: PodResourcesEmulator
    proc_root: Path

    def scrape(self) -> str:
        with urllib.request.urlopen(self.server.url, timeout=10) as resp:
            return str(resp.read().decode())

    async def ascrape(self) -> str:
        return await asyncio.to_thread(self.scrape)


@pytest.fixture
async def node(sock_dir: Path, tmp_path: Path) -> AsyncIterator[Node]:
    backend = ScriptedBackend(gpu_statuses=default_statuses())
    books: list[ContainerDevices] = []
    pods: dict[PodUid, tuple[str, str]] = {}
    emulator = PodResourcesEmulator(sock_dir / "kubelet.sock", lambda: tuple(books))
    async with emulator, PodResourcesClient(sock_dir / "kubelet.sock") as client:
        refresher = SnapshotRefresher(
            backend=backend,
            assignments=client,
            current=lambda: (PLAN, INVENTORY),
            hostname="gpu-node-1",
            proc_root=tmp_path,
            pods=lambda: pods,
            clock=lambda: 1_700_000_000.0,
        )
        registry, plugin = exporter_registry(lambda: refresher.latest)
        plugin.record_allocate(SHARED, True, 0.0004)
        plugin.record_allocate(SHARED, False, 0.002)
        plugin.record_health_transition(L40S, False)
        plugin.record_config_reload(True)
        async with MetricsServer(registry, host="127.0.0.1", port=0) as server:
            yield Node(backend, books, pods, refresher, server, emulator, tmp_path)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def pod_value(text: str, name: str, pod: str) -> float | None:
    for labels, value in samples(text).get(name, []):
        if labels["pod"] == pod:
            return value
    return None


def add_pod(n: Node, devices: ContainerDevices, pid: int, index: int) -> None:
    write_proc(n.proc_root, pid, v2_systemd_containerd(uid(index), container_id(index)))
    n.books.append(devices)
    n.pods[PodUid(uid(index))] = (devices.namespace, devices.pod)


async def test_nothing_but_plugin_counters_before_first_snapshot(node: Node) -> None:
    text = await node.ascrape()
    got = samples(text)
    assert "DCGM_FI_DEV_FB_USED" not in got
    assert got["gpuslice_config_reloads_total"] == [({"result": "success"}, 1.0)]


async def test_gpu_metrics_have_dcgm_names_and_labels(node: Node) -> None:
    await node.refresher.refresh()
    got = samples(await node.ascrape())
    fb_used = {labels["UUID"]: (labels, v) for labels, v in got["DCGM_FI_DEV_FB_USED"]}
    labels, value = fb_used[T4]
    assert labels == {"gpu": "0", "UUID": T4, "modelName": "Tesla T4", "Hostname": "gpu-node-1"}
    assert value == 3000
    free = {labels["UUID"]: v for labels, v in got["DCGM_FI_DEV_FB_FREE"]}
    assert free[T4] == 12360
    util = {labels["UUID"]: v for labels, v in got["DCGM_FI_DEV_GPU_UTIL"]}
    assert A100_MIG not in util  # NVML gives no device utilisation under MIG on A100
    assert util[A100_MPS] == 70
    xid = {labels["UUID"]: v for labels, v in got["DCGM_FI_DEV_XID_ERRORS"]}
    assert (xid[A100_MIG], xid[T4]) == (31, 0)
    power = {labels["UUID"]: v for labels, v in got["DCGM_FI_DEV_POWER_USAGE"]}
    assert power[A100_MPS] == 250.0
    temp = {labels["UUID"]: v for labels, v in got["DCGM_FI_DEV_GPU_TEMP"]}
    assert temp[L40S] == 30
    advertised = {labels["resource"]: v for labels, v in got["gpuslice_advertised_devices"]}
    assert advertised == {
        SHARED: 4,
        MPS: 2,
        MIG_1G_RES: 1,
        "nvidia.com/mig-3g.40gb": 1,
        "nvidia.com/gpu": 1,
    }


async def test_pod_usage_appears_and_disappears_with_the_pod(node: Node) -> None:
    await node.refresher.refresh()
    assert pod_value(await node.ascrape(), "gpuslice_pod_memory_used_bytes", "train") is None

    add_pod(node, TRAIN, 101, 1)
    node.backend.gpu_processes = [proc(101, T4, 1200, sm=30)]
    await node.refresher.refresh()
    text = await node.ascrape()
    assert pod_value(text, "gpuslice_pod_memory_used_bytes", "train") == 1200 * MIB
    assert pod_value(text, "gpuslice_pod_sm_util_percent", "train") == 30
    assert pod_value(text, "gpuslice_pod_entitled_memory_bytes", "train") == 3840 * MIB
    assert pod_value(text, "gpuslice_pod_entitled_sm_fraction", "train") == 0.25
    allocated = {lab["resource"]: v for lab, v in samples(text)["gpuslice_allocated_devices"]}
    assert allocated[SHARED] == 1
    (labels, _v) = samples(text)["gpuslice_pod_memory_used_bytes"][0]
    assert labels == {
        "namespace": "ml",
        "pod": "train",
        "container": "main",
        "gpu": "0",
        "UUID": T4,
    }

    node.books.clear()
    node.backend.gpu_processes = []
    await node.refresher.refresh()
    text = await node.ascrape()
    assert pod_value(text, "gpuslice_pod_memory_used_bytes", "train") is None
    assert pod_value(text, "gpuslice_pod_entitled_memory_bytes", "train") is None


async def test_over_share_is_one_comparison(node: Node) -> None:
    add_pod(node, TRAIN, 101, 1)
    add_pod(node, MPS_JOB, 301, 3)
    # train uses 5000 MiB of a 3840 MiB fair share; mps-job stays under its 40960 MiB limit.
    node.backend.gpu_processes = [proc(101, T4, 5000, sm=80), proc(301, A100_MPS, 1000, sm=10)]
    await node.refresher.refresh()
    got = samples(await node.ascrape())
    used = {lab["pod"]: v for lab, v in got["gpuslice_pod_memory_used_bytes"]}
    ent = {lab["pod"]: v for lab, v in got["gpuslice_pod_entitled_memory_bytes"]}
    over = {pod for pod in used if used[pod] > ent[pod]}
    assert over == {"train"}
    gauge = {lab["pod"]: v for lab, v in got["gpuslice_pod_memory_over_share"]}
    assert gauge == {"train": 1, "mps-job": 0}
    sm = {lab["pod"]: v for lab, v in got["gpuslice_pod_sm_util_percent"]}
    sm_ent = {lab["pod"]: v for lab, v in got["gpuslice_pod_entitled_sm_fraction"]}
    assert {pod for pod in sm if sm[pod] / 100 > sm_ent[pod]} == {"train"}


async def test_kubelet_restart_keeps_last_assignments_then_catches_up(node: Node) -> None:
    add_pod(node, MIG_JOB, 401, 4)
    node.backend.gpu_processes = [proc(401, A100_MIG, 2000, mig=MIG_1G)]
    await node.refresher.refresh()
    await node.emulator.stop()
    snap = await node.refresher.refresh()
    assert any("pod assignments unavailable" in p for p in snap.problems)
    assert pod_value(await node.ascrape(), "gpuslice_pod_memory_used_bytes", "tiny") == 2000 * MIB
    node.books.clear()
    await node.emulator.start()
    snap = await node.refresher.refresh()
    assert snap.problems == ()
    assert pod_value(await node.ascrape(), "gpuslice_pod_memory_used_bytes", "tiny") is None


async def test_backend_failure_is_reported_not_raised(node: Node) -> None:
    node.backend.fail_statuses = True
    snap = await node.refresher.refresh()
    assert snap.gpus == ()
    assert any("GPU is lost" in p for p in snap.problems)


async def test_refresh_loop_runs_until_stopped(node: Node) -> None:
    node.refresher.interval_s = 0.01
    stop = asyncio.Event()
    task = asyncio.create_task(node.refresher.run(stop))
    for _ in range(2):
        node.refresher.updated.clear()
        await asyncio.wait_for(node.refresher.updated.wait(), timeout=10)
    stop.set()
    await asyncio.wait_for(task, timeout=10)
    assert node.refresher.latest is not None


PROMTOOL_MISSING = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool (Debian package `prometheus`) is not installed; the format lint cannot run",
)
CAMEL_CASE_DCGM_LABEL = re.compile(
    r"^DCGM_FI_DEV_\w+ label names should be written in 'snake_case' not 'camelCase'$"
)


async def promtool(text: str) -> tuple[int, list[str]]:
    result = await asyncio.to_thread(
        subprocess.run,
        ["promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return result.returncode, lines


@PROMTOOL_MISSING
async def test_promtool_accepts_the_plugin_metrics(node: Node) -> None:
    rc, problems = await promtool(await node.ascrape())
    assert (rc, problems) == (0, [])


@PROMTOOL_MISSING
async def test_promtool_accepts_a_full_scrape_but_dcgm_camel_case_labels(node: Node) -> None:
    """dcgm-exporter's label `modelName` is kept so dashboards port; promtool's linter
    flags it as camelCase. That is the only complaint allowed: any format error or any
    other lint (units, counter suffixes, gpuslice's own names) fails the test."""
    add_pod(node, TRAIN, 101, 1)
    add_pod(node, MPS_JOB, 301, 3)
    add_pod(node, MIG_JOB, 401, 4)
    node.backend.gpu_processes = [
        proc(101, T4, 1000, sm=10),
        proc(301, A100_MPS, 1000, sm=10),
        proc(401, A100_MIG, 1000, mig=MIG_1G),
        proc(999, L40S, 10),  # no /proc entry: exited, or a host process
    ]
    await node.refresher.refresh()
    text = await node.ascrape()
    assert "gpuslice_allocate_duration_seconds_bucket" in text
    assert "gpuslice_unattributed_gpu_processes" in text
    _rc, problems = await promtool(text)
    assert problems
    assert [p for p in problems if not CAMEL_CASE_DCGM_LABEL.match(p)] == []
    without_dcgm = "\n".join(line for line in text.splitlines() if "DCGM_FI_DEV_" not in line)
    rc, problems = await promtool(without_dcgm + "\n")
    assert (rc, problems) == (0, [])


async def test_refresh_loop_skips_while_another_poller_keeps_the_snapshot_fresh(
    node: Node,
) -> None:
    """The memory guard refreshes the same snapshot every second; the exporter's loop must
    not read NVML and /proc again while that snapshot is younger than its interval."""
    now = [0.0]
    looks = [0]  # the loop reads the clock once a round, to ask whether the snapshot is fresh

    def clock() -> float:
        looks[0] += 1
        return now[0]

    node.refresher.monotonic = clock
    node.refresher.interval_s = 0.01
    await node.refresher.refresh()  # the other poller, at t=0
    node.refresher.updated.clear()
    stop = asyncio.Event()
    task = asyncio.create_task(node.refresher.run(stop))
    start = looks[0]
    # five of the loop's own rounds pass, each finding the snapshot fresh
    await eventually(lambda: looks[0] >= start + 5, "five rounds of the refresh loop")
    assert not node.refresher.updated.is_set(), "refreshed a snapshot that was still fresh"
    now[0] = 1.0  # nobody refreshed for 100 intervals: the loop does it again
    await asyncio.wait_for(node.refresher.updated.wait(), timeout=10)
    stop.set()
    await asyncio.wait_for(task, timeout=10)
