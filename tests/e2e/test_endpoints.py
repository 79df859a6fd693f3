"""The daemon's probes and `/status` end to end, and `gpuslice top` reading the real daemon."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.podresources import PodResourcesEmulator
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.metrics_support import (
    CONFIG,
    PID,
    WAIT_S,
    fake_proc,
    samples,
    status_code,
    wait_code,
    wait_scrape,
)


async def test_readyz_turns_ready_only_once_the_kubelet_took_the_registration(
    sock_dir: Path,
) -> None:
    port = free_port()
    plugin_dir = sock_dir / "dp"
    plugin_dir.mkdir()
    (sock_dir / "config.yaml").write_text(CONFIG)
    daemon = DaemonProcess(
        [
            "--node",
            "sim:1xt4",
            "--config-file",
            str(sock_dir / "config.yaml"),
            "--device-plugin-path",
            str(plugin_dir),
            "--no-compute-mode",
            "--no-labels",
            "--metrics-port",
            str(port),
            "--pod-resources-socket",
            str(sock_dir / "none.sock"),
        ],
        log_path=sock_dir / "daemon.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(sock_dir / "ctl")},
    )
    await daemon.start()
    kubelet = KubeletEmulator(plugin_dir)
    try:
        base = f"http://127.0.0.1:{port}"
        await wait_code(f"{base}/healthz", 200)
        assert await status_code(f"{base}/readyz") == 503, "no kubelet yet: not ready"
        await kubelet.start()
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
        await wait_code(f"{base}/readyz", 200)
        assert await status_code(f"{base}/nothing-here") == 404
    finally:
        assert await daemon.terminate() == 0, daemon.log()
        await kubelet.stop()


async def test_top_shows_the_pods_and_shares_the_daemon_exports(sock_dir: Path) -> None:
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
            await kubelet.admit("ml", "infer-0", [("server", {"nvidia.com/gpu": 1})])
            node.control.add_process(PID, 0, used_memory_mib=5000, sm_util_percent=30)

            def has_pod(text: str) -> bool:
                return any(
                    lbl.get("pod") == "infer-0"
                    for lbl, _ in samples(text, "gpuslice_pod_memory_used_bytes")
                )

            text = await wait_scrape(port, has_pod, "infer-0's memory")
            url = f"http://127.0.0.1:{port}"
            top = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuslice",
                "top",
                "--url",
                url,
                "-o",
                "json",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await top.communicate()
            assert top.returncode == 0, err.decode()
            doc = json.loads(out)
            exported = {
                (lbl["namespace"], lbl["pod"], lbl["container"]): v
                for lbl, v in samples(text, "gpuslice_pod_entitled_memory_bytes")
            }
            shown = {
                (p["namespace"], p["pod"], p["container"]): p["memory_entitled_bytes"]
                for p in doc["pods"]
            }
            assert shown == exported == {("ml", "infer-0", "server"): 15360 * 2**20 / 4}
            (pod,) = doc["pods"]
            assert pod["over_share"] is True, "5000 MiB of a 3840 MiB share"
            assert pod["sm_share"] == 0.25
            assert doc["pod_resources"]["state"] == "ok"
            assert doc["ready"] is True
            (res,) = doc["resources"]
            assert res["name"] == "nvidia.com/gpu"
            assert res["per_gpu"][0]["replicas"] == 4

            table = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuslice",
                "top",
                "--url",
                url,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "COLUMNS": "200"},
            )
            tout, terr = await table.communicate()
            assert table.returncode == 0, terr.decode()
            assert "ml/infer-0" in tout.decode()
            assert "OVER" in tout.decode()


async def test_status_says_when_the_daemon_has_no_pod_resources_socket(sock_dir: Path) -> None:
    port = free_port()
    args = [
        "--no-labels",
        "--metrics-port",
        str(port),
        "--metrics-interval",
        "0.2",
        "--pod-resources-socket",
        str(sock_dir / "none.sock"),
    ]
    async with running_daemon(sock_dir, CONFIG, node="sim:1xt4", args=args):
        url = f"http://127.0.0.1:{port}"
        await wait_code(f"{url}/status", 200)
        top = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuslice",
            "top",
            "--url",
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )
        out, err = await top.communicate()
        assert top.returncode == 0, err.decode()
        assert "no PodResources socket" in " ".join(out.decode().split())


async def test_top_header_is_the_daemons_node_name(sock_dir: Path) -> None:
    """Not this machine's hostname: the node the daemon runs for (NODE_NAME)."""
    with running_apiserver() as api:
        # after the API double took its own ephemeral port, which could otherwise be the
        # very port free_port() just released
        port = free_port()
        api.add_node("gpu-node-9")
        args = [
            "--no-labels",
            "--node-name",
            "gpu-node-9",
            "--kubeconfig",
            str(api.write_kubeconfig(sock_dir / "kubeconfig")),
            "--metrics-port",
            str(port),
            "--pod-resources-socket",
            str(sock_dir / "none.sock"),
        ]
        async with running_daemon(sock_dir, CONFIG, node="sim:1xt4", args=args):
            url = f"http://127.0.0.1:{port}"
            await wait_code(f"{url}/status", 200)
            top = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuslice",
                "top",
                "--url",
                url,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "COLUMNS": "200"},
            )
            out, err = await top.communicate()
            assert top.returncode == 0, err.decode()
            assert out.decode().splitlines()[0].startswith("gpu-node-9  config ")
