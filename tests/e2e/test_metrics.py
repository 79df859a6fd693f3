"""Per-pod GPU metrics from the real daemon: the kubelet's PodResources (emulated over its
unix socket), simulated GPU processes, a fake `/proc` tree, and scrapes over HTTP."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from gpuslice.podresources import PodResourcesEmulator
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.envtest import free_port
from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.metrics_support import (
    CONFIG,
    PID,
    WAIT_S,
    fake_proc,
    samples,
    wait_scrape,
)


async def test_pod_usage_appears_and_disappears_with_the_pod(sock_dir: Path) -> None:
    port = free_port()
    proc = fake_proc(sock_dir / "proc")
    pr_socket = sock_dir / "pr.sock"
    args = [
        "--no-labels",
        "--metrics-port",
        str(port),
        "--metrics-interval",
        "0.2",
        "--proc-root",
        str(proc),
        "--pod-resources-socket",
        str(pr_socket),
    ]
    async with running_daemon(sock_dir, CONFIG, node="sim:1xt4", args=args) as node:
        kubelet = node.kubelet
        async with PodResourcesEmulator(pr_socket, kubelet.assignments):
            await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
            await kubelet.admit("ml", "infer-0", [("server", {"nvidia.com/gpu": 1})])
            node.control.add_process(PID, 0, used_memory_mib=1024, sm_util_percent=30)

            def has_pod(text: str) -> bool:
                return any(
                    lbl.get("pod") == "infer-0"
                    for lbl, _ in samples(text, "gpuslice_pod_memory_used_bytes")
                )

            text = await wait_scrape(port, has_pod, "infer-0's memory")
            ((labels, used),) = samples(text, "gpuslice_pod_memory_used_bytes")
            assert labels["namespace"] == "ml"
            assert labels["container"] == "server"
            assert labels["UUID"].startswith("GPU-")
            assert used == 1024 * 2**20
            ((_, entitled),) = samples(text, "gpuslice_pod_entitled_memory_bytes")
            assert entitled == 15360 * 2**20 / 4, "a 1/4 time-slice share of a T4"
            ((_, fraction),) = samples(text, "gpuslice_pod_entitled_sm_fraction")
            assert fraction == pytest.approx(0.25)
            ok = [
                v
                for lbl, v in samples(text, "gpuslice_allocate_requests_total")
                if lbl.get("result") == "success"
            ]
            assert ok == [1.0]
            fb = samples(text, "DCGM_FI_DEV_FB_USED")
            assert [lbl["modelName"] for lbl, _ in fb] == ["Tesla T4"]

            if shutil.which("promtool"):
                check = await asyncio.create_subprocess_exec(
                    "promtool",
                    "check",
                    "metrics",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                out, _ = await check.communicate(text.encode())
                problems = [ln for ln in out.decode().splitlines() if ln.strip()]
                # DCGM's `modelName` label is kept so existing dashboards work; promtool's
                # style lint flags its camelCase and nothing else may be reported.
                assert all("camelCase" in ln and "DCGM_FI_DEV" in ln for ln in problems), out

            await kubelet.delete_pod("ml", "infer-0")
            node.control.remove_process(PID)
            await wait_scrape(port, lambda t: not has_pod(t), "infer-0 to disappear")


async def test_two_pods_time_slicing_one_gpu_are_told_apart(sock_dir: Path) -> None:
    """The case DCGM exporter could not attribute for years: two pods on replicas of one GPU.

    PodResources says both hold a replica of GPU 0; only the pod UIDs in their processes'
    cgroups (mapped to pods through the API server) tell whose memory is whose."""
    uids = {
        "trainer": "11111111-2222-4333-8444-555555555555",
        "notebook": "66666666-7777-4888-9999-000000000000",
    }
    cids = {"trainer": "b" * 64, "notebook": "c" * 64}
    pids = {"trainer": 5001, "notebook": 5002}
    proc = sock_dir / "proc"
    for pod, pid in pids.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods/burstable/pod{uids[pod]}/{cids[pod]}\n"  # cgroupfs driver
        )
    pr_socket = sock_dir / "pr.sock"
    with running_apiserver() as api:
        port = free_port()  # after the double took its ephemeral port: never the same
        api.add_node("gpu-node-1")
        for pod in uids:
            api.add_pod("ml", pod, uids[pod], "gpu-node-1", {"main": f"containerd://{cids[pod]}"})
        args = [
            "--no-labels",
            "--node-name",
            "gpu-node-1",
            "--kubeconfig",
            str(api.write_kubeconfig(sock_dir / "kubeconfig")),
            "--metrics-port",
            str(port),
            "--metrics-interval",
            "0.2",
            "--proc-root",
            str(proc),
            "--pod-resources-socket",
            str(pr_socket),
        ]
        async with running_daemon(sock_dir, CONFIG, node="sim:1xt4", args=args) as node:
            kubelet = node.kubelet
            async with PodResourcesEmulator(pr_socket, kubelet.assignments):
                await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
                for pod in uids:
                    await kubelet.admit("ml", pod, [("main", {"nvidia.com/gpu": 1})])
                node.control.add_process(pids["trainer"], 0, used_memory_mib=9000)
                node.control.add_process(pids["notebook"], 0, used_memory_mib=512)

                def both(text: str) -> bool:
                    # A snapshot taken between the admissions and the processes shows
                    # both pods at 0 bytes; wait for one taken after the processes.
                    found = samples(text, "gpuslice_pod_memory_used_bytes")
                    return {lbl["pod"] for lbl, v in found if v > 0} == set(uids)

                text = await wait_scrape(port, both, "both pods' memory")
                used = {lbl["pod"]: v for lbl, v in samples(text, "gpuslice_pod_memory_used_bytes")}
                assert used == {"trainer": 9000 * 2**20, "notebook": 512 * 2**20}
                entitled = {
                    lbl["pod"]: v for lbl, v in samples(text, "gpuslice_pod_entitled_memory_bytes")
                }
                # the trainer is over its fair share of the T4 (15360 MiB / 4), the notebook not
                over = {p for p in used if used[p] > entitled[p]}
                assert over == {"trainer"}
