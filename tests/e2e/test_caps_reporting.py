"""What the daemon reports of caps is what holds (issue 40 item 8), black-box: `/status`,
the metrics and the daemon's log, on a simulated L40S of driver branch r615 with a cgroup
tree in a temp directory.

* A cgroup v2 tree with no pod's cgroup in it (what the agent's pod sees of
  `/sys/fs/cgroup` in its own cgroup namespace, without the chart's mount of the host's
  tree): no GPU is reported capped; the reason says the pods' cgroups are not under
  `--cgroup-root`. On an observing guard the GPU is protected by nothing, and says so.
* A container whose cgroup is not found keeps its GPU from being reported capped, with
  that reason on the GPU and on the container, until its cgroup appears and its limits are
  read back.
* Without the kubelet's PodResources socket the caps loop warns once, not a traceback a
  round, and reports nothing capped.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.podresources import PodResourcesEmulator
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.envtest import free_port
from gpuslice.testing.eventually import eventually_async
from tests.e2e.daemon_fixtures import Node, running_daemon
from tests.e2e.guard_support import CONFIG, NODE, WAIT_S, sleeper
from tests.e2e.metrics_support import samples, wait_scrape

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root")

PODS = {"steady": 2, "late": 3}
SHARE = 46068 * 1024 * 1024 // 4
NO_POD_CGROUPS = (
    "pods' cgroups not found under --cgroup-root (mount the host's /sys/fs/cgroup there)"
)
UIDS = {pod: f"11111111-2222-4333-8444-{n:012d}" for pod, n in PODS.items()}
CIDS = {pod: f"{n}" * 64 for pod, n in PODS.items()}


def _scope(root: Path, pod: str) -> Path:
    under = UIDS[pod].replace("-", "_")
    return (
        root / "kubepods.slice" / "kubepods-burstable.slice"
        / f"kubepods-burstable-pod{under}.slice" / f"cri-containerd-{CIDS[pod]}.scope"
    )  # fmt: skip


@dataclass
class Running:
    node: Node
    port: int
    cgroups: Path
    log: Path


@asynccontextmanager
async def _daemon(
    sock_dir: Path, *, pods_tree: bool, guard: str, pod_resources: bool = True
) -> AsyncIterator[Running]:
    children = {pod: sleeper() for pod in PODS}
    try:
        proc, cgroups = sock_dir / "proc", sock_dir / "cgroup"
        cgroups.mkdir()
        (cgroups / "cgroup.controllers").write_text("cpu memory pids\n")
        if pods_tree:
            (cgroups / "kubepods.slice").mkdir()
        for pod, child in children.items():
            (proc / str(child.pid)).mkdir(parents=True)
            (proc / str(child.pid) / "cgroup").write_text(
                f"0::/kubepods/burstable/pod{UIDS[pod]}/{CIDS[pod]}\n"
            )
        node_file = sock_dir / "node.yaml"
        node_file.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n')
        pr_socket = sock_dir / "pr.sock"
        with running_apiserver() as api:
            port = free_port()
            api.add_node(NODE)
            for pod in PODS:
                api.add_pod("ml", pod, UIDS[pod], NODE, {"main": f"containerd://{CIDS[pod]}"})
            args = [
                "--no-labels", "--node-name", NODE,
                "--kubeconfig", str(api.write_kubeconfig(sock_dir / "kubeconfig")),
                "--metrics-port", str(port), "--metrics-interval", "0.2",
                "--proc-root", str(proc), "--cgroup-root", str(cgroups),
                "--pod-resources-socket", str(pr_socket),
                f"--memory-guard={guard}", "--memory-guard-interval=0.2",
                "--memory-caps=auto",
            ]  # fmt: skip
            async with running_daemon(sock_dir, CONFIG, node=str(node_file), args=args) as node:
                kubelet = node.kubelet
                await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
                for pod in PODS:
                    await kubelet.admit("ml", pod, [("main", {"nvidia.com/gpu": 1})])
                node.control.add_process(children["steady"].pid, 0, used_memory_mib=10000)
                node.control.add_process(children["late"].pid, 0, used_memory_mib=6000)
                running = Running(node, port, cgroups, sock_dir / "daemon.log")
                if pod_resources:
                    async with PodResourcesEmulator(pr_socket, kubelet.assignments):
                        yield running
                else:
                    yield running
    finally:
        for c in children.values():
            if c.poll() is None:
                c.kill()
            c.wait()


def _status(port: int) -> Json:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
        doc: Json = json.loads(response.read())
    return doc


async def _pods_listed(port: int) -> Json:
    """`/status` once both pods are attributed (their processes seen in a snapshot)."""
    got: list[Json] = [{}]

    async def both() -> bool:
        got[0] = await asyncio.to_thread(_status, port)
        return {p["pod"] for p in got[0].get("pods", [])} == set(PODS)

    await eventually_async(both, "both pods attributed", timeout=WAIT_S)
    return got[0]


def _protection(text: str) -> list[tuple[str, str]]:
    return [
        (lbl["protection"], lbl["reason"])
        for lbl, _ in samples(text, "gpuslice_gpu_memory_protection")
    ]


def _stamp(text: str) -> float:
    got = samples(text, "gpuslice_metrics_snapshot_timestamp_seconds")
    return got[0][1] if got else 0.0


async def _rounds_later(port: int, seconds: float) -> str:
    """A scrape `seconds` of snapshots after the current one (the caps loop runs at the
    same 0.2 s interval, so about 5 rounds a second)."""
    first = await wait_scrape(port, lambda t: _stamp(t) > 0, "a snapshot")
    stamp = _stamp(first)
    return await wait_scrape(port, lambda t: _stamp(t) >= stamp + seconds, f"{seconds} s on")


async def test_an_own_cgroup_namespace_is_not_reported_capped(sock_dir: Path) -> None:
    async with _daemon(sock_dir, pods_tree=False, guard="enforce") as run:
        status = await _pods_listed(run.port)
        [gpu] = status["gpus"]
        assert (gpu["memory_protection"], gpu["memory_protection_reason"]) == (
            "guarded",
            NO_POD_CGROUPS,
        )
        assert not [p for p in status["pods"] if p["memory_capped"]]
        text = await wait_scrape(run.port, lambda t: bool(_protection(t)), "the gauge")
        assert _protection(text) == [("guarded", NO_POD_CGROUPS)]
        assert "event=caps-started" not in run.log.read_text()  # nothing to run


async def test_an_observing_guard_protects_nothing(sock_dir: Path) -> None:
    async with _daemon(sock_dir, pods_tree=False, guard="observe") as run:
        [gpu] = (await _pods_listed(run.port))["gpus"]
        assert (gpu["memory_protection"], gpu["memory_protection_reason"]) == (
            "none",
            NO_POD_CGROUPS,
        )


async def test_a_container_without_its_cgroup_keeps_the_gpu_uncapped(sock_dir: Path) -> None:
    async with _daemon(sock_dir, pods_tree=True, guard="enforce") as run:
        _scope(run.cgroups, "steady").mkdir(parents=True)
        missing = f"its cgroup was not found under {run.cgroups}"

        async def steady_capped_late_waiting() -> bool:
            doc = await asyncio.to_thread(_status, run.port)
            pods = {p["pod"]: p for p in doc.get("pods", [])}
            return (
                set(pods) == set(PODS)
                and pods["steady"]["memory_capped"]
                and pods["late"]["memory_caps_reason"] == missing
            )

        await eventually_async(steady_capped_late_waiting, "steady capped", timeout=WAIT_S)
        status = await asyncio.to_thread(_status, run.port)
        [gpu] = status["gpus"]
        assert gpu["memory_protection"] == "guarded"
        assert gpu["memory_protection_reason"] == f"a container is not capped: {missing}"
        pods = {p["pod"]: p for p in status["pods"]}
        assert pods["steady"]["memory_soft_limit_bytes"] == SHARE
        assert pods["late"]["memory_capped"] is False
        assert pods["late"]["memory_soft_limit_bytes"] is None

        _scope(run.cgroups, "late").mkdir(parents=True)
        text = await wait_scrape(
            run.port, lambda t: _protection(t) == [("capped", "")], "capped once both hold"
        )
        soft = {lbl["pod"]: v for lbl, v in samples(text, "gpuslice_pod_memory_soft_limit_bytes")}
        assert soft == dict.fromkeys(PODS, float(SHARE))


async def test_a_missing_pod_resources_socket_is_one_warning(sock_dir: Path) -> None:
    async with _daemon(sock_dir, pods_tree=True, guard="enforce", pod_resources=False) as run:
        _scope(run.cgroups, "steady").mkdir(parents=True)
        text = await _rounds_later(run.port, 2.0)
        log = run.log.read_text()
        assert log.count("event=caps-pod-resources-unavailable") == 1
        assert "caps-round-failed" not in log
        assert "Traceback" not in log
        assert _protection(text) == [
            ("guarded", "no container's memory limits confirmed on this GPU yet")
        ]
