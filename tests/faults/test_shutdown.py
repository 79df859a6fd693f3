"""Shutdown always happens: SIGTERM ends the daemon while its event loop is blocked, the
watchdog logs the blocked loop's stack, and SIGTERM with Allocates in flight answers or
cleanly refuses each of them, exits 0 and removes its sockets."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc

from gpuslice.agent.watchdog import HARD_EXIT_CODE
from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.eventually import eventually
from tests.e2e.daemon_fixtures import FAKE_MPS, running_daemon

WAIT_S = 20.0
INJECT = Path(__file__).resolve().parent / "inject"
TS = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: {n}\n"
)


async def test_sigterm_ends_the_daemon_while_a_reload_blocks_the_loop(sock_dir: Path) -> None:
    plugin_dir = sock_dir / "dp"
    plugin_dir.mkdir()
    config = sock_dir / "config.yaml"
    config.write_text(TS.format(n=4), encoding="utf-8")
    marker = sock_dir / "reload-started"
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    daemon = DaemonProcess(
        [
            "--node",
            "sim:2xt4",
            "--config-file",
            str(config),
            "--device-plugin-path",
            str(plugin_dir),
            "--no-labels",
            "--no-compute-mode",
            "--mps-control",
            FAKE_MPS,
            "--config-poll-interval",
            "0.1",
            "--shutdown-grace",
            "2",
        ],
        log_path=sock_dir / "daemon.log",
        env={
            "GPUSLICE_SIM_CONTROL_DIR": str(sock_dir / "ctl"),
            "GPUSLICE_TEST_BLOCK_RELOAD": str(marker),
            "PYTHONPATH": os.pathsep.join([str(INJECT), os.environ.get("PYTHONPATH", "")]),
        },
    )
    await daemon.start()
    try:
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        config.write_text(TS.format(n=2), encoding="utf-8")  # a reload, which blocks
        await eventually(marker.exists, "the reload to start blocking", timeout=WAIT_S)
        # the watchdog names the blocked loop and shows where it is stuck
        await eventually(
            lambda: "event=loop-blocked" in daemon.log(), "the loop-blocked event", timeout=WAIT_S
        )
        assert "_blocking_reload" in daemon.log()
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        code = await daemon.wait_exit(WAIT_S)  # a deadline for the test, not a timing claim
        assert code == HARD_EXIT_CODE, daemon.log()
        assert "event=signal signal=SIGTERM" in daemon.log()
        assert "event=hard-exit" in daemon.log()
    finally:
        await daemon.terminate(grace_s=1.0)
        await kubelet.stop()


async def test_sigterm_with_20_allocates_in_flight(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS.format(n=4)) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        ids = sorted(kubelet.devices("nvidia.com/gpu"))
        socket = node.plugin_dir / "nvidia-gpu.sock"
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            await client.get_device_plugin_options(timeout_s=WAIT_S)  # connected

            async def allocate(i: int) -> str:
                request = api.AllocateRequest(
                    container_requests=[
                        api.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])
                    ]
                )
                try:
                    response = await client.allocate(request, timeout_s=WAIT_S)
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name
                assert len(response.container_responses) == 1
                return "OK"

            calls = [asyncio.create_task(allocate(i)) for i in range(20)]
            await asyncio.sleep(0)
            assert node.daemon.proc is not None
            node.daemon.proc.send_signal(signal.SIGTERM)
            outcomes = await asyncio.gather(*calls)
        code = await node.daemon.wait_exit(WAIT_S)
        assert code == 0, node.daemon.log()
        # answered, or refused the way a stopping server refuses; never a hang or an error
        assert set(outcomes) <= {"OK", "UNAVAILABLE", "CANCELLED"}, outcomes
        assert node.plugin_sockets() == set()
        assert "Traceback" not in node.daemon.log()
