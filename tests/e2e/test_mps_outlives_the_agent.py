"""Device-plugin mode: the MPS control daemon outlives the agent process, as its clients do.

Quitting the daemon cuts every client of every pod sharing it, so an agent that stops
(SIGTERM: a rollout, a rollback, a drained node) or dies (SIGKILL: a force-deleted pod, the
OOM killer) leaves it running, and the next agent takes it over when it was started with the
settings the new plan wants. Only other settings (or a plan without MPS) replace it.

Real `gpuslice plugin` processes on a simulated node, one after the other on the same MPS
root, with the fake control program as the daemon.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.mps import ControlProgram
from gpuslice.mps.control import process_alive
from gpuslice.testing.daemon import DaemonProcess
from tests.e2e.daemon_fixtures import FAKE_MPS
from tests.e2e.mps_support import WAIT_S, ask_daemon, mps_config

RESOURCE = "nvidia.com/gpu"
HEALTH = "get_default_active_thread_percentage"


@contextlib.asynccontextmanager
async def agent(
    workdir: Path, mps_root: Path, config: str
) -> AsyncIterator[tuple[KubeletEmulator, DaemonProcess]]:
    """One agent with its own kubelet; the caller ends it (SIGTERM or SIGKILL) and checks how.
    Left running at the end, it gets SIGTERM."""
    plugin_dir = workdir / "dp"
    plugin_dir.mkdir(parents=True)
    config_path = workdir / "config.yaml"
    config_path.write_text(config, encoding="utf-8")
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    daemon = DaemonProcess(
        [
            "--node",
            "sim:1xl40s",
            "--config-file",
            str(config_path),
            "--device-plugin-path",
            str(plugin_dir),
            "--no-compute-mode",
            "--mps-control",
            FAKE_MPS,
            "--mps-root",
            str(mps_root),
            "--mps-health-interval",
            "0.5",
            "--config-poll-interval",
            "0.1",
            "--no-labels",
        ],
        log_path=workdir / "daemon.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(workdir / "ctl")},
    )
    await daemon.start()
    try:
        yield kubelet, daemon
    finally:
        await daemon.terminate()
        await kubelet.stop()


async def serving(kubelet: KubeletEmulator, daemon: DaemonProcess, replicas: int) -> None:
    """Until the kubelet sees every replica allocatable (the daemon answers with its limits)."""
    try:
        await kubelet.wait_for(
            lambda: kubelet.allocatable(RESOURCE) == replicas or not daemon.running, WAIT_S
        )
    except TimeoutError:
        raise AssertionError(f"replicas never allocatable:\n{daemon.log()}") from None
    assert daemon.running, daemon.log()


def daemon_pid(mps_root: Path) -> int | None:
    pipe = mps_root / RESOURCE / "pipe"
    return ControlProgram(pipe, mps_root / RESOURCE / "log").daemon_pid()


def control_log(mps_root: Path) -> str:
    return (mps_root / RESOURCE / "log" / "control.log").read_text()


async def test_the_daemon_outlives_sigterm_and_sigkill_of_the_agent(sock_dir: Path) -> None:
    mps_root = sock_dir / "mps"
    pipe = mps_root / RESOURCE / "pipe"
    async with agent(sock_dir / "first", mps_root, mps_config(10)) as (kubelet, first):
        await serving(kubelet, first, 10)
        pid = daemon_pid(mps_root)
        assert pid is not None
        assert await first.terminate() == 0, first.log()
    assert process_alive(pid), "SIGTERM: the daemon is left to its clients"
    assert float(await ask_daemon(pipe, HEALTH)) == 10
    assert not (mps_root / ".ready").exists()  # nobody vouches for it between agents

    async with agent(sock_dir / "second", mps_root, mps_config(10)) as (kubelet, second):
        await serving(kubelet, second, 10)
        assert daemon_pid(mps_root) == pid, "taken over, not replaced"
        assert "event=mps-daemon-taken-over" in second.log()
        assert second.proc is not None
        second.proc.send_signal(signal.SIGKILL)
        assert await second.wait_exit(WAIT_S) == -signal.SIGKILL
    assert process_alive(pid), "SIGKILL: nothing ran, the daemon is as it was"
    assert float(await ask_daemon(pipe, HEALTH)) == 10

    async with agent(sock_dir / "third", mps_root, mps_config(10)) as (kubelet, third):
        await serving(kubelet, third, 10)
        assert daemon_pid(mps_root) == pid
        assert float(await ask_daemon(pipe, HEALTH)) == 10
        log = control_log(mps_root)
        assert log.count(" Started") == 1, log
        assert "Command: quit" not in log, log

        # a reload that no longer asks for MPS is when the daemon goes
        (sock_dir / "third" / "config.yaml").write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 2\n",
            encoding="utf-8",
        )
        await kubelet.wait_for(lambda: not process_alive(pid), WAIT_S)
        assert "Command: quit" in control_log(mps_root)
        assert await third.terminate() == 0, third.log()


async def test_a_daemon_with_other_settings_is_replaced_by_the_next_agent(sock_dir: Path) -> None:
    mps_root = sock_dir / "mps"
    pipe = mps_root / RESOURCE / "pipe"
    async with agent(sock_dir / "first", mps_root, mps_config(10)) as (kubelet, first):
        await serving(kubelet, first, 10)
        old = daemon_pid(mps_root)
        assert old is not None
        assert await first.terminate() == 0, first.log()
    assert process_alive(old)

    # the rollout also changed the config: 5 replicas, so other limits for the daemon
    async with agent(sock_dir / "second", mps_root, mps_config(5)) as (kubelet, second):
        await serving(kubelet, second, 5)
        new = daemon_pid(mps_root)
        assert new is not None
        assert new != old
        assert not process_alive(old)
        assert float(await ask_daemon(pipe, HEALTH)) == 20
        assert "event=mps-daemon-replaced" in second.log()
        assert await second.terminate() == 0, second.log()
    assert process_alive(new)
    await ask_daemon(pipe, "quit")  # the test's cleanup: no agent follows
