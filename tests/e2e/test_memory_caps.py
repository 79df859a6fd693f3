"""Memory caps in the real daemon (device-plugin mode): three pods time-slicing a simulated
L40S of driver branch r615 (which has the limits calls), on a node whose cgroup v2 tree is
a temp directory. The agent finds each container's cgroup from the pod watch, sets soft =
hard = its share (11517 MiB) through the simulated NVML, reads them back into the metrics,
and says the GPU is capped. A pod that then grows fails its own allocation at its cap, and
the guard, enforcing with no grace, stops nobody. A pod that holds 28000 MiB in its cgroup
(allocated before its limit was set, which the driver keeps) is not held by its cap: it
stays in the guard's view and is stopped, as on a driver without caps (issue 40, item 2),
its read-back usage reported. The same node with a driver before r615 is guarded instead,
and the guard stops the overrunning pod as before."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.podresources import PodResourcesEmulator
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.envtest import free_port
from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.guard_support import CONFIG, NODE, WAIT_S, sleeper
from tests.e2e.metrics_support import samples, wait_scrape

PODS = {"leaker": 1, "steady": 2, "late": 3}
SHARE = 46068 * 1024 * 1024 // 4


def _tree(root: Path, uids: dict[str, str], cids: dict[str, str]) -> None:
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    for pod in PODS:
        under = uids[pod].replace("-", "_")
        scope = (
            root / "kubepods.slice" / "kubepods-burstable.slice"
            / f"kubepods-burstable-pod{under}.slice" / f"cri-containerd-{cids[pod]}.scope"
        )  # fmt: skip
        scope.mkdir(parents=True)


def _scope(root: Path, uid: str, cid: str) -> str:
    """The container's cgroup as the agent finds it (NVML's `nameSpace`)."""
    under = uid.replace("-", "_")
    return str(
        root / "kubepods.slice" / "kubepods-burstable.slice"
        / f"kubepods-burstable-pod{under}.slice" / f"cri-containerd-{cid}.scope"
    )  # fmt: skip


async def _run(
    sock_dir: Path, driver: str, leak: str = "held", events: list[str] | None = None
) -> tuple[str, int | None, Json]:
    """(the last scrape, the leaker's return code or None while it runs, `/status`).
    `leak`: `held` (28000 MiB in its cgroup, whatever its limits) or `grows` (a growing
    process in its cgroup, which fails its own allocation at its hard limit)."""
    children = {pod: sleeper() for pod in PODS}
    try:
        proc, cgroups = sock_dir / "proc", sock_dir / "cgroup"
        uids = {pod: f"11111111-2222-4333-8444-{n:012d}" for pod, n in PODS.items()}
        cids = {pod: f"{n}" * 64 for pod, n in PODS.items()}
        _tree(cgroups, uids, cids)
        for pod, child in children.items():
            (proc / str(child.pid)).mkdir(parents=True)
            (proc / str(child.pid) / "cgroup").write_text(
                f"0::/kubepods/burstable/pod{uids[pod]}/{cids[pod]}\n"
            )
        node_file = sock_dir / "node.yaml"
        node_file.write_text(f'driverVersion: "{driver}"\ngpus:\n  - model: l40s\n')
        pr_socket = sock_dir / "pr.sock"
        with running_apiserver() as api:
            port = free_port()
            api.add_node(NODE)
            for pod in PODS:
                api.add_pod("ml", pod, uids[pod], NODE, {"main": f"containerd://{cids[pod]}"})
            args = [
                "--no-labels", "--node-name", NODE,
                "--kubeconfig", str(api.write_kubeconfig(sock_dir / "kubeconfig")),
                "--metrics-port", str(port), "--metrics-interval", "0.2",
                "--proc-root", str(proc), "--cgroup-root", str(cgroups),
                "--pod-resources-socket", str(pr_socket),
                "--memory-guard=enforce", "--memory-guard-interval=0.2",
                "--memory-guard-grace=0", "--memory-caps=auto",
            ]  # fmt: skip
            async with running_daemon(sock_dir, CONFIG, node=str(node_file), args=args) as node:
                kubelet = node.kubelet
                async with PodResourcesEmulator(pr_socket, kubelet.assignments):
                    await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
                    for pod in PODS:
                        await kubelet.admit("ml", pod, [("main", {"nvidia.com/gpu": 1})])
                    node.control.add_process(children["steady"].pid, 0, used_memory_mib=10000)
                    node.control.add_process(children["late"].pid, 0, used_memory_mib=6000)
                    if driver.startswith("615"):

                        def capped(text: str) -> bool:
                            soft = samples(text, "gpuslice_pod_memory_soft_limit_bytes")
                            return {lbl["pod"] for lbl, v in soft if v == SHARE} == set(PODS)

                        await wait_scrape(port, capped, "every pod capped at its share")
                    leaker = children["leaker"].pid
                    cgroup = _scope(cgroups, uids["leaker"], cids["leaker"])
                    if leak == "grows":
                        node.control.grow_process(
                            leaker, 0, start_mib=1000, rate_mib_s=8000, cgroup=cgroup
                        )
                        text = await wait_scrape(port, _grown, "the leaker grown")
                    else:
                        # far over its share, free memory under the reserve (4606 MiB)
                        node.control.add_process(leaker, 0, used_memory_mib=28000, cgroup=cgroup)
                        text = await wait_scrape(port, _over, "the leaker over its share")
                    # ten guard polls (0.2 s) after the snapshot showed it
                    stamp = _stamp(text)
                    text = await wait_scrape(port, lambda t: _stamp(t) >= stamp + 2.0, "2 s on")
                    status = await asyncio.to_thread(_status, port)
                    if events is not None:
                        events.extend(f"{e['reason']}: {e['message']}" for e in api.events("ml"))
                    return text, children["leaker"].poll(), status
    finally:
        for c in children.values():
            if c.poll() is None:
                c.kill()
            c.wait()


def _status(port: int) -> Json:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
        doc: Json = json.loads(response.read())
    return doc


def _over(text: str) -> bool:
    got = samples(text, "gpuslice_pod_memory_over_share")
    return ("leaker", 1.0) in {(lbl["pod"], v) for lbl, v in got}


def _grown(text: str) -> bool:
    got = samples(text, "gpuslice_pod_memory_used_bytes")
    return any(lbl["pod"] == "leaker" and v >= 4000 * 1024 * 1024 for lbl, v in got)


def _stamp(text: str) -> float:
    got = samples(text, "gpuslice_metrics_snapshot_timestamp_seconds")
    return got[0][1] if got else 0.0


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root (NVML needs it)")
async def test_capped_pods_are_held_by_the_driver_and_nobody_is_stopped(sock_dir: Path) -> None:
    text, leaker, status = await _run(sock_dir, "615.20", leak="grows")
    [gpu] = status["gpus"]
    assert gpu["memory_protection"] == "capped"
    assert {p["pod"]: p["memory_soft_limit_bytes"] for p in status["pods"]} == dict.fromkeys(
        PODS, SHARE
    )
    assert leaker is None  # the guard stepped back: its own allocation would fail instead
    protection = samples(text, "gpuslice_gpu_memory_protection")
    assert [(lbl["protection"], lbl["reason"]) for lbl, _ in protection] == [("capped", "")]
    hard = {lbl["pod"]: v for lbl, v in samples(text, "gpuslice_pod_memory_hard_limit_bytes")}
    assert hard == dict.fromkeys(PODS, float(SHARE))
    reclaims = samples(text, "gpuslice_memory_guard_decisions_total")
    assert not [v for lbl, v in reclaims if lbl["kind"] == "reclaim" and v > 0]
    over = samples(text, "gpuslice_pod_memory_over_share")
    assert not [lbl for lbl, v in over if v > 0]  # it failed at its cap, never over it


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root (NVML needs it)")
async def test_a_capped_pod_over_its_cap_is_stopped_as_on_a_driver_without_caps(
    sock_dir: Path,
) -> None:
    events: list[str] = []
    text, leaker, status = await _run(sock_dir, "615.20", leak="held", events=events)
    assert status["gpus"][0]["memory_protection"] == "capped"
    assert leaker == -signal.SIGTERM
    said = [e for e in events if "uses 28000 MiB" in e]
    kinds = [e.split(":", 1)[0] for e in said]
    assert kinds[:2] == ["GPUMemoryOverShare", "GPUMemoryReclaimed"], said
    assert "reclaimed (over-cap)" in said[1], said
    reclaims = samples(text, "gpuslice_memory_guard_decisions_total")
    assert [v for lbl, v in reclaims if lbl["kind"] == "reclaim" and lbl["enforced"] == "true"]
    used = {lbl["pod"]: v for lbl, v in samples(text, "gpuslice_pod_memory_capped_used_bytes")}
    assert used["leaker"] == 28000 * 1024 * 1024  # the read-back: the cgroup's own memory
    assert used["steady"] == 0  # its process is in no cgroup the simulator knows


async def test_an_old_driver_is_guarded_and_the_overrunning_pod_stopped(sock_dir: Path) -> None:
    text, leaker, status = await _run(sock_dir, "580.95.05")
    assert status["gpus"][0]["memory_protection"] == "guarded"
    assert leaker == -signal.SIGTERM
    protection = samples(text, "gpuslice_gpu_memory_protection")
    [(labels, _)] = protection
    assert labels["protection"] == "guarded"
    assert "r615" in labels["reason"]
    assert samples(text, "gpuslice_pod_memory_soft_limit_bytes") == []
