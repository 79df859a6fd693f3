"""An agent whose MPS daemon cannot start (NVIDIA's MPS values on a chart that gave it no
privilege, a node without the driver's control program) says so where an operator looks:
`/status` lists the daemon as down with the reason and a warning, and `gpuslice top` shows
it DOWN, instead of MPS devices that look ready with nothing said.

A real `gpuslice plugin` on a simulated node; the control program does not exist, which is
what the daemon's start meets without the driver or the privilege."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from gpuslice.cli.top import DaemonUnreachable, fetch_status
from gpuslice.core.jsontypes import Json
from gpuslice.metrics.top import render_status
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from gpuslice.testing.eventually import eventually_async
from tests.e2e.daemon_fixtures import FAKE_MPS
from tests.e2e.mps_support import mps_config


def agent(workdir: Path, port: int, control: str) -> DaemonProcess:
    plugin_dir = workdir / "dp"
    plugin_dir.mkdir(parents=True)
    config = workdir / "config.yaml"
    config.write_text(mps_config(4), encoding="utf-8")
    return DaemonProcess(
        [
            "--node",
            "sim:1xl40s",
            "--config-file",
            str(config),
            "--device-plugin-path",
            str(plugin_dir),
            "--kubelet-socket",
            "",
            "--no-compute-mode",
            "--mps-control",
            control,
            "--mps-root",
            str(workdir / "mps"),
            "--mps-health-interval",
            "0.5",
            "--no-labels",
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--pod-resources-socket",
            str(workdir / "none.sock"),
        ],
        log_path=workdir / "daemon.log",
    )


async def status_when(port: int, daemon: DaemonProcess, state: str) -> Json:
    found: list[Json] = []

    async def reached() -> bool:
        try:
            doc = await asyncio.to_thread(fetch_status, f"http://127.0.0.1:{port}")
        except DaemonUnreachable:  # not listening yet
            return False
        found[:] = [doc]
        return [d.get("state") for d in doc.get("mps_daemons", [])] == [state]

    await eventually_async(reached, f"the MPS daemon {state}", timeout=20, explain=daemon.log)
    return found[0]


def shown(doc: Json) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render_status(doc))
    return console.export_text()


async def test_an_mps_daemon_that_cannot_start_is_a_warning_not_ready(sock_dir: Path) -> None:
    port = free_port()
    daemon = agent(sock_dir, port, str(sock_dir / "no-nvidia-cuda-mps-control"))
    await daemon.start()
    try:
        doc = await status_when(port, daemon, "down")
    finally:
        await daemon.terminate()
    [state] = doc["mps_daemons"]
    assert state["resource"] == "nvidia.com/gpu"
    assert "failed to start" in state["problem"]
    assert any(
        w.startswith("MPS daemon for nvidia.com/gpu is down, its replicas Unhealthy: ")
        for w in doc["warnings"]
    ), doc["warnings"]
    text = shown(doc)
    assert "nvidia.com/gpu: DOWN" in text, text
    assert "is down, its replicas Unhealthy" in text, text


async def test_a_running_mps_daemon_shows_ready(sock_dir: Path) -> None:
    port = free_port()
    daemon = agent(sock_dir, port, FAKE_MPS)
    await daemon.start()
    try:
        doc = await status_when(port, daemon, "ready")
    finally:
        await daemon.terminate()
    assert not any("MPS daemon" in w for w in doc["warnings"]), doc["warnings"]
    assert "nvidia.com/gpu: READY" in shown(doc)
