"""The exporter in DRA mode: a claims plan, PodResources with dynamic resources (over real
gRPC, filtered to our driver), simulated GPU processes and a fake /proc, scraped over HTTP,
checked by promtool; then `/status` and `top` from the same snapshot.

The claims plan is hand-built as the design note describes the driver's (one resource
`claim:<ns>/<name>` per prepared claim, IDs `<pool>/<device>[/<shareID>]`).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gpuslice.agent.guard_view import guard_view_reader
from gpuslice.core.cgroups import PodUid
from gpuslice.core.guard.model import GuardMode
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MpsShare,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.core.units import MIB
from gpuslice.metrics import MetricsServer, SnapshotRefresher, exporter_registry
from gpuslice.metrics.snapshot import MetricsSnapshot
from gpuslice.metrics.status import build_status
from gpuslice.metrics.top import render_status, render_top
from gpuslice.podresources import PodResourcesClient, PodResourcesEmulator
from tests.metrics.metrics_fixtures import (
    A100_MPS,
    INVENTORY,
    L40S,
    T4,
    ScriptedBackend,
    container_id,
    default_statuses,
    proc,
    uid,
    v2_systemd_containerd,
    write_proc,
)

DRIVER = "gpu.nvidia.com"
POOL = "gpu-node-1"
t4, a100, _mig, l40s = INVENTORY.gpus


def claim(
    name: str, strategy: SharingStrategy, device_id: str, phys: PhysicalDevice, **kw: object
) -> ResourcePlan:
    res = ResourceName(f"claim:{name}")
    dev = AdvertisedDevice(DeviceId(device_id), phys, None, **kw)  # type: ignore[arg-type]
    return ResourcePlan(res, res, strategy, False, (dev,))


# L40S offered as 4 shares; `big` got 30000 MiB of it, `small` 8000 MiB. T4 whole to one
# claim. The A100 under MPS for a claim two pods share (GuardConfig sharedBy: 2).
PLAN = Plan(
    resources=(
        claim(
            "ml/big",
            SharingStrategy.TIME_SLICING,
            f"{POOL}/gpu-3/s-big",
            PhysicalDevice.of_gpu(l40s),
            replicas=4,
            entitlement_mib=30000,
        ),
        claim(
            "ml/small",
            SharingStrategy.TIME_SLICING,
            f"{POOL}/gpu-3/s-small",
            PhysicalDevice.of_gpu(l40s),
            replicas=4,
            entitlement_mib=8000,
        ),
        claim(
            "lab/whole",
            SharingStrategy.NONE,
            f"{POOL}/gpu-0",
            PhysicalDevice.of_gpu(t4),
            replicas=1,
        ),
        claim(
            "ml/mps",
            SharingStrategy.MPS,
            f"{POOL}/gpu-1",
            PhysicalDevice.of_gpu(a100),
            replicas=2,
            mps=MpsShare(50, 40960),
        ),
    )
)
PODS = {
    # pod: (namespace, claim, device, share ID, pid, GPU, MiB used)
    "trainer": ("ml", "big", "gpu-3", "s-big", 101, L40S, 32000),
    "infer": ("ml", "small", "gpu-3", "s-small", 102, L40S, 4000),
    "nb": ("lab", "whole", "gpu-0", None, 103, T4, 1000),
    "mps-a": ("ml", "mps", "gpu-1", None, 104, A100_MPS, 1000),
    "mps-b": ("ml", "mps", "gpu-1", None, 105, A100_MPS, 2000),
}


@dataclass
class Node:
    refresher: SnapshotRefresher
    server: MetricsServer

    async def scrape(self) -> str:
        def get() -> str:
            with urllib.request.urlopen(self.server.url, timeout=10) as resp:
                return str(resp.read().decode())

        return await asyncio.to_thread(get)


@pytest.fixture
async def node(sock_dir: Path, tmp_path: Path) -> AsyncIterator[Node]:
    path = sock_dir / "kubelet.sock"
    pods: dict[PodUid, tuple[str, str]] = {}
    processes = []
    async with PodResourcesEmulator(path) as emulator:
        for n, (pod, (ns, name, device, share, pid, gpu, mib)) in enumerate(PODS.items(), 1):
            devices = [(DRIVER, POOL, device, share, [f"k8s.gpuslice.io/claim={n}-{device}"])]
            if pod == "trainer":  # the same claim also holds another driver's NIC
                devices.append(("nic.example.com", POOL, "eth1", None, []))
            emulator.book_claim(ns, pod, "main", ns, name, devices)
            write_proc(tmp_path, pid, v2_systemd_containerd(uid(n), container_id(n)))
            pods[PodUid(uid(n))] = (ns, pod)
            processes.append(proc(pid, gpu, mib, sm=10))
        backend = ScriptedBackend(gpu_statuses=default_statuses(), gpu_processes=processes)
        async with PodResourcesClient(path, dra_driver=DRIVER) as client:
            refresher = SnapshotRefresher(
                backend=backend,
                assignments=client,
                current=lambda: (PLAN, INVENTORY),
                hostname="gpu-node-1",
                proc_root=tmp_path,
                pods=lambda: pods,
                clock=lambda: 1_700_000_000.0,
            )
            registry, _plugin = exporter_registry(lambda: refresher.latest)
            async with MetricsServer(registry, host="127.0.0.1", port=0) as server:
                yield Node(refresher, server)


def series(text: str, name: str) -> dict[str, tuple[dict[str, str], float]]:
    """pod -> (labels, value) of one family."""
    out: dict[str, tuple[dict[str, str], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels["pod"]] = (dict(s.labels), s.value)
    return out


async def test_per_pod_series_carry_the_claim_and_the_shares_entitlement(node: Node) -> None:
    snap = await node.refresher.refresh()
    assert snap.attribution.unattributed == ()
    assert snap.attribution.unknown_device_ids == ()  # the NIC was filtered out
    text = await node.scrape()
    used = series(text, "gpuslice_pod_memory_used_bytes")
    assert {pod: labels["claim"] for pod, (labels, _v) in used.items()} == {
        "trainer": "ml/big",
        "infer": "ml/small",
        "nb": "lab/whole",
        "mps-a": "ml/mps",
        "mps-b": "ml/mps",
    }
    assert used["trainer"][0] == {
        "namespace": "ml",
        "pod": "trainer",
        "container": "main",
        "gpu": "3",
        "UUID": L40S,
        "claim": "ml/big",
    }
    entitled = {p: v for p, (_l, v) in series(text, "gpuslice_pod_entitled_memory_bytes").items()}
    assert entitled == {
        "trainer": 30000 * MIB,  # the share's consumed capacity, not 46068 / 4
        "infer": 8000 * MIB,
        "nb": 15360 * MIB,
        "mps-a": 40960 * MIB,
        "mps-b": 40960 * MIB,
    }
    sm = {p: v for p, (_l, v) in series(text, "gpuslice_pod_entitled_sm_fraction").items()}
    # a time-sliced share's SM fraction follows its memory (30000 of 46068 MiB)
    assert (sm["trainer"], sm["nb"], sm["mps-a"]) == (pytest.approx(30000 / 46068), 1.0, 0.5)
    over = {p: v for p, (_l, v) in series(text, "gpuslice_pod_memory_over_share").items()}
    assert {p for p, v in over.items() if v} == {"trainer"}
    # Series of every per-pod family carry the same claim, so joins on it line up.
    for family in ("gpuslice_pod_sm_util_percent", "gpuslice_pod_entitled_sm_fraction"):
        assert series(text, family)["infer"][0]["claim"] == "ml/small"
    advertised = {
        s.labels["resource"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gpuslice_allocated_devices"
    }
    assert advertised == {
        "claim:ml/big": 1,
        "claim:ml/small": 1,
        "claim:lab/whole": 1,
        "claim:ml/mps": 1,
    }


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
async def test_promtool_accepts_the_dra_scrape(node: Node) -> None:
    await node.refresher.refresh()
    text = await node.scrape()
    assert 'claim="ml/big"' in text
    without_dcgm = "\n".join(line for line in text.splitlines() if "DCGM_FI_DEV_" not in line)
    result = await asyncio.to_thread(
        subprocess.run,
        ["promtool", "check", "metrics"],
        input=without_dcgm + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def text_of(renderable: object) -> str:
    console = Console(width=240, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def row(out: str, key: str) -> list[str]:
    line = next(line for line in out.splitlines() if key in line)
    return [cell.strip() for cell in line.split("│") if cell.strip()]


def status_of(snap: MetricsSnapshot) -> dict[str, object]:
    return build_status(
        node_name="gpu-node-1",
        config_name=None,
        plan=PLAN,
        snapshot=snap,
        gpu_metrics=True,
        pod_resources_socket="/pr.sock",
        pod_resources_present=True,
        ready=(True, ""),
    )


async def test_status_and_top_show_the_claim(node: Node) -> None:
    snap = await node.refresher.refresh()
    doc = status_of(snap)
    pods = doc["pods"]
    assert isinstance(pods, list)
    claims = {p["pod"]: p["claims"] for p in pods}
    assert claims["trainer"] == ["ml/big"]
    assert claims["mps-b"] == ["ml/mps"]
    resources = doc["resources"]
    assert isinstance(resources, list)
    big = next(r for r in resources if r["name"] == "claim:ml/big")
    assert big["per_gpu"][0]["entitlement_mib"] == 30000
    shown = text_of(render_status(doc, now=1_700_000_000.0))
    assert row(shown, "ml/trainer")[:5] == ["3", "ml/trainer", "main", "ml/big", "time-slicing"]
    assert "GPU 3: 1x of 46068 MiB (30000 MiB held)" in shown
    local = text_of(render_top(snap, now=1_700_000_000.0))
    assert row(local, "ml/mps-a")[:5] == ["1", "ml/mps-a", "main", "ml/mps", "mps"]


async def test_the_guards_view_takes_each_claims_mode(node: Node) -> None:
    """What `agent.build` wires in DRA mode: the guard's reader over the shared snapshot,
    with the driver's per-claim GuardConfig modes; claims without one take the node's."""
    modes: dict[str, GuardMode] = {"claim:ml/big": "observe", "claim:ml/mps": "off"}
    read = guard_view_reader(
        node.refresher.backend,
        lambda: (PLAN, INVENTORY),
        node.refresher,
        node.refresher.proc_root,
        mode_of=modes.get,
    )
    view = await read()
    assert view is not None
    tenants = {t.key.pod: t for t in view.tenants}
    assert {pod: t.mode for pod, t in tenants.items()} == {
        "trainer": "observe",
        "infer": None,
        "nb": None,
        "mps-a": "off",
        "mps-b": "off",
    }
    assert tenants["trainer"].share_bytes == 30000 * MIB
    assert set(view.identities) == {101, 102, 103, 104, 105}
