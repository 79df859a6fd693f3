"""Faults the daemon must ride out, through the real process and the kubelet emulator:
SIGKILL with stale sockets, an XID storm, Allocates from many clients while the config
flips and the kubelet restarts, a config file caught half-written, and a hostile config at
start-up. Counts are scaled down from `bench/bench_faults.py` to keep CI short."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import grpc
import pytest

from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.hostile_configs import HOSTILE
from tests.e2e.daemon_fixtures import FAKE_MPS, running_daemon

WAIT_S = 20.0
FAST = ["--no-labels", "--config-poll-interval", "0.1"]
TS = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: {n}\n"
)


async def test_sigkill_then_restart_over_stale_sockets(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS.format(n=4)) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        for round_ in range(3):
            assert node.daemon.proc is not None
            node.daemon.proc.kill()
            await node.daemon.proc.wait()
            assert node.plugin_sockets() == {"nvidia-gpu.sock"}  # stale, left behind
            registrations = kubelet.registrations["nvidia.com/gpu"]
            await node.daemon.start()  # the same command line, a new process
            await kubelet.wait_for(
                lambda r=registrations: kubelet.registrations["nvidia.com/gpu"] > r,  # type: ignore[misc]
                WAIT_S,
            )
            await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
            adm = await kubelet.admit("default", f"p{round_}", [("c", {"nvidia.com/gpu": 1})])
            assert adm.containers[0].device_ids


async def test_xid_storm_then_recovery(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS.format(n=4)) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        for i in range(200):  # the bench sends 1,000
            node.control.inject_xid(i % 2, 79 if i % 2 else 13)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4, WAIT_S)
        await kubelet.wait_for(lambda: not node.control.pending(), WAIT_S)
        assert kubelet.allocatable("nvidia.com/gpu") == 4
        node.control.inject_recovery(1)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8, WAIT_S)
        adm = await kubelet.admit("default", "after", [("c", {"nvidia.com/gpu": 1})])
        assert adm.containers[0].device_ids
        assert node.daemon.running


async def test_allocates_while_config_flips_and_kubelet_restarts(sock_dir: Path) -> None:
    """10 clients, 200 Allocates (the bench: 50 and 1,000). IDs `::0` and `::1` exist under
    both configs, so every call must be answered, or refused as UNAVAILABLE or CANCELLED
    while the server is re-created for the new kubelet; none may hang or fail otherwise."""
    async with running_daemon(sock_dir, TS.format(n=4), args=FAST) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        ids = sorted(i for i in kubelet.devices("nvidia.com/gpu") if i.endswith(("::0", "::1")))
        socket = str(node.plugin_dir / "nvidia-gpu.sock")
        outcomes: list[str] = []

        async def client(n: int, calls: int) -> None:
            async with grpc.aio.insecure_channel(unix_target(socket)) as channel:
                stub = DevicePluginClient(channel)
                for k in range(calls):
                    device = ids[(n + k) % len(ids)]
                    request = api.AllocateRequest(
                        container_requests=[api.ContainerAllocateRequest(devices_ids=[device])]
                    )
                    try:
                        await stub.allocate(request, timeout_s=WAIT_S)
                        outcomes.append("OK")
                    except grpc.aio.AioRpcError as exc:
                        outcomes.append(exc.code().name)

        async def churn() -> None:
            for n in itertools.islice(itertools.cycle([2, 4]), 6):
                node.write_config(TS.format(n=n))
                await asyncio.sleep(0.3)
                if n == 2:
                    await kubelet.restart()

        await asyncio.gather(churn(), *(client(n, 20) for n in range(10)))
        assert len(outcomes) == 200
        assert set(outcomes) <= {"OK", "UNAVAILABLE", "CANCELLED"}, sorted(set(outcomes))
        assert outcomes.count("OK") > 0
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        assert node.daemon.running


async def test_half_written_config_never_becomes_the_plan(sock_dir: Path) -> None:
    """A writer that truncates then writes (no atomic rename): the empty file would be the
    all-defaults config (2 whole GPUs). The reload loop takes a file only once it holds
    still across two checks, so the plan never drops to 2."""
    args = ["--no-labels", "--config-poll-interval", "0.2"]  # above the empty window
    async with running_daemon(sock_dir, TS.format(n=4), args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        seen: set[int] = set()
        for n in itertools.islice(itertools.cycle([4, 3]), 20):
            with node.config.open("w", encoding="utf-8") as f:  # truncates: empty for a moment
                f.flush()
                os.fsync(f.fileno())
                await asyncio.sleep(0.08)
                f.write(TS.format(n=n))
            for _ in range(5):
                seen.add(kubelet.capacity("nvidia.com/gpu"))
                await asyncio.sleep(0.05)
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 6, WAIT_S)
        seen.add(kubelet.capacity("nvidia.com/gpu"))
        assert 2 not in seen, seen
        assert 'resources="nvidia.com/gpu=6"' in node.daemon.log()  # the plan line's form
        assert 'resources="nvidia.com/gpu=2"' not in node.daemon.log()


@pytest.mark.parametrize("name", ["utf-16", "huge-integer", "deep-yaml", "fifo", "alias-bomb"])
async def test_hostile_config_at_start_is_a_clean_exit_2(sock_dir: Path, name: str) -> None:
    config = sock_dir / "config.yaml"
    config.write_text(TS.format(n=4), encoding="utf-8")
    HOSTILE[name](config)
    daemon = DaemonProcess(
        [
            "--node",
            "sim:2xt4",
            "--config-file",
            str(config),
            "--device-plugin-path",
            str(sock_dir),
            "--kubelet-socket",
            "",
            "--no-labels",
            "--mps-control",
            FAKE_MPS,
        ],
        log_path=sock_dir / "daemon.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(sock_dir / "ctl")},
    )
    await daemon.start()
    code = await daemon.wait_exit(WAIT_S)
    log = daemon.log()
    assert code == 2, log
    assert "Traceback" not in log
    assert "error: invalid config" in log
