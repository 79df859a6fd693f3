"""MPS sharing through the real daemon: the control daemon is started, configured, watched
and restarted by gpuslice, and the kubelet only gets allocatable replicas while it answers.

The control program is the fake one (`gpuslice.emulator.fake_mps_control`, speaking the same
commands on stdin); everything else is the production path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.emulator.admission import AdmissionError
from gpuslice.mps.control import process_alive
from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.mps_support import WAIT_S, ask_daemon, mps_config

L40S_MIB = 46068


async def test_mps_daemon_limits_allocate_and_restart(sock_dir: Path) -> None:
    mps_root = sock_dir / "mps"
    args = ["--mps-root", str(mps_root), "--mps-health-interval", "0.5", "--no-labels"]
    async with running_daemon(sock_dir, mps_config(10), node="sim:1xl40s", args=args) as node:
        kubelet = node.kubelet
        pipe = mps_root / "nvidia.com/gpu/pipe"
        # replicas become allocatable only once the control daemon answers
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 10, WAIT_S)
        assert (mps_root / ".ready").exists()
        assert (mps_root / "nvidia.com/gpu/.started").exists()

        # the limits NVIDIA's daemon sets, read back from the control daemon
        assert float(await ask_daemon(pipe, "get_default_active_thread_percentage")) == 10
        limit = await ask_daemon(pipe, "get_default_device_pinned_mem_limit 0")
        # 46068 MiB // 10 = 4606M, as NVIDIA/k8s-device-plugin#764 shows; the daemon prints
        # it in whole GiB, as the real one does (driver 580), and its log has the exact value
        assert limit == "4G", limit
        sent = (mps_root / "nvidia.com/gpu/log/control.log").read_text()
        assert "set_default_device_pinned_mem_limit 0 4606M" in sent

        adm = await kubelet.admit("ml", "infer-0", [("main", {"nvidia.com/gpu": 1})])
        c = adm.containers[0]
        assert c.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
        assert c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
        assert c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4606M"
        mounts = {(m.host_path, m.container_path) for m in c.mounts}
        assert (str(pipe), "/mps/nvidia.com/gpu/pipe") in mounts
        assert (str(mps_root / "shm"), "/dev/shm") in mounts

        # a crashed control daemon: replicas withdrawn (Unhealthy), daemon restarted,
        # limits applied again, replicas back
        pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 0, WAIT_S)
        assert kubelet.capacity("nvidia.com/gpu") == 10
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 10, WAIT_S)
        new_pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
        assert new_pid != pid
        assert float(await ask_daemon(pipe, "get_default_active_thread_percentage")) == 10
    # shutdown left the daemon to its clients (test_mps_outlives_the_agent) and took down
    # the node's `.ready`; `.started` records the daemon's settings for the next agent
    assert process_alive(new_pid)
    assert not (mps_root / ".ready").exists()
    assert (mps_root / "nvidia.com/gpu/.started").exists()
    await ask_daemon(pipe, "quit")  # the test's cleanup: no agent follows


async def test_mps_refuses_more_than_one_replica_per_container(sock_dir: Path) -> None:
    args = ["--mps-root", str(sock_dir / "mps"), "--no-labels"]
    async with running_daemon(sock_dir, mps_config(4), node="sim:1xl40s", args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4, WAIT_S)
        with pytest.raises(AdmissionError) as err:
            await kubelet.admit("ml", "greedy", [("main", {"nvidia.com/gpu": 2})])
        assert "maximum request size for shared resources is 1; found 2" in str(err.value)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process the agent must never signal (the kubelet, say), planted by a pod."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_pid_planted_by_a_pod_is_never_signalled(
    sock_dir: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """The pipe directory is mounted read-write into pods; its pid file is pod input."""
    mps_root = sock_dir / "mps"
    args = ["--mps-root", str(mps_root), "--mps-health-interval", "0.5", "--no-labels"]
    async with running_daemon(sock_dir, mps_config(4), node="sim:1xl40s", args=args) as node:
        kubelet = node.kubelet
        pid_file = mps_root / "nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid"
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4, WAIT_S)
        # restart: the daemon hangs, a pod has planted the bystander's pid
        hung = int(pid_file.read_text())
        os.kill(hung, signal.SIGSTOP)
        pid_file.write_text(f"{bystander.pid}\n")
        # the command timeout (10 s), then the quit grace (5 s) pass
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 0, 30)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4, 45)
        assert bystander.poll() is None
        assert not process_alive(hung)
        # shutdown: hung again, planted again
        current = int(pid_file.read_text())
        assert current != bystander.pid
        os.kill(current, signal.SIGSTOP)
        pid_file.write_text(f"{bystander.pid}\n")
    assert bystander.poll() is None, f"bystander ended with {bystander.returncode}"
    # a stopping agent leaves its daemon to the next agent (test_mps_outlives_the_agent),
    # hung or not: it signals nothing at shutdown
    assert process_alive(current)
    os.kill(current, signal.SIGKILL)  # the test's cleanup
