"""Device-plugin mode: an agent restarted into a config that no longer shares a GPU with MPS
(a `helm upgrade` changing the values, a node relabelled while its agent was down, an
uninstall and reinstall) or that renamed the MPS resource stops the daemon the previous
agent left and resets the compute mode it set, before it advertises anything, as a live
reload to that config does (tests/e2e/test_mps_outlives_the_agent.py). Otherwise
time-sliced replicas are advertised on a GPU left in EXCLUSIVE_PROCESS (their pods find
"all CUDA-capable devices are busy or unavailable"), or a second daemon runs on the GPU.

Real `gpuslice plugin` processes on a simulated node, the fake control program as the
daemon and an `nvidia-smi` that records its calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.mps import ControlProgram
from gpuslice.mps.control import process_alive
from gpuslice.testing.daemon import DaemonProcess
from tests.e2e.daemon_fixtures import FAKE_MPS
from tests.e2e.mps_support import WAIT_S, ask_daemon, mps_config
from tests.e2e_dra.dra_node import fake_nvidia_smi

TIME_SLICED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n"
)
RENAMED = (
    "version: v1\nsharing:\n  mps:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu.shared\n      replicas: 10\n"
)


@contextlib.asynccontextmanager
async def agent(workdir: Path, root: Path, config: str) -> AsyncIterator[KubeletEmulator]:
    """One agent with its own kubelet, on the node's MPS root and `nvidia-smi`, ended with
    SIGTERM (which leaves its MPS daemons running for the next agent)."""
    plugin_dir = workdir / "dp"
    plugin_dir.mkdir(parents=True)
    config_path = workdir / "config.yaml"
    config_path.write_text(config, encoding="utf-8")
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    daemon = DaemonProcess(
        [
            "--node", "sim:1xl40s",
            "--config-file", str(config_path),
            "--device-plugin-path", str(plugin_dir),
            "--nvidia-smi", str(root / "nvidia-smi"),
            "--mps-control", FAKE_MPS,
            "--mps-root", str(root / "mps"),
            "--mps-health-interval", "0.5",
            "--no-labels",
        ],
        log_path=workdir / "daemon.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(workdir / "ctl")},
    )  # fmt: skip
    await daemon.start()
    try:
        yield kubelet
        assert daemon.running, daemon.log()
    finally:
        assert await daemon.terminate() == 0, daemon.log()
        await kubelet.stop()


def daemon_pid(root: Path, resource: str) -> int | None:
    base = root / "mps" / resource
    return ControlProgram(base / "pipe", base / "log").daemon_pid()


def smi_calls(root: Path) -> list[str]:
    path = root / "nvidia-smi.calls"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


async def mps_left_running(root: Path) -> tuple[int, str]:
    """The first agent, MPS on the GPU, stopped: (its daemon's pid, the GPU's UUID)."""
    async with agent(root / "first", root, mps_config(10)) as kubelet:
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 10, WAIT_S)
        pid = daemon_pid(root, "nvidia.com/gpu")
        assert pid is not None
    assert process_alive(pid), "left for its clients"
    [call] = smi_calls(root)
    assert call.endswith("-c EXCLUSIVE_PROCESS")
    return pid, call.split()[1]


async def test_a_restart_into_time_slicing_stops_the_daemon_and_resets_the_gpu_first(
    sock_dir: Path,
) -> None:
    fake_nvidia_smi(sock_dir)
    pid, gpu = await mps_left_running(sock_dir)
    async with agent(sock_dir / "second", sock_dir, TIME_SLICED) as kubelet:
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 2, WAIT_S)
        # what the kubelet sees advertised is already on a GPU without MPS
        assert not process_alive(pid), "the previous agent's daemon is stopped"
        assert smi_calls(sock_dir)[-1] == f"-i {gpu} -c DEFAULT"
        assert not (sock_dir / "mps" / "nvidia.com/gpu" / ".started").exists()
    async with agent(sock_dir / "third", sock_dir, TIME_SLICED) as kubelet:
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 2, WAIT_S)
    assert len(smi_calls(sock_dir)) == 2, "nothing left to undo at the next start"


async def test_a_renamed_mps_resource_runs_one_daemon_on_the_gpu(sock_dir: Path) -> None:
    fake_nvidia_smi(sock_dir)
    pid, gpu = await mps_left_running(sock_dir)
    async with agent(sock_dir / "second", sock_dir, RENAMED) as kubelet:
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu.shared") == 10, WAIT_S)
        assert not process_alive(pid), "the old resource's daemon is stopped"
        renamed = daemon_pid(sock_dir, "nvidia.com/gpu.shared")
        assert renamed is not None
        assert process_alive(renamed)
        # the GPU stays exclusive for the daemon that serves it now
        assert f"-i {gpu} -c DEFAULT" not in smi_calls(sock_dir)
    await ask_daemon(sock_dir / "mps" / "nvidia.com/gpu.shared" / "pipe", "quit")  # cleanup
