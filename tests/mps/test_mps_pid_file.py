"""The pid file is pod-writable: whatever it names, only the daemon the agent started dies.

A bystander (a child of the test, standing in for the kubelet) is planted in the pid file
while the daemon is frozen with SIGSTOP, so the agent has to kill something at restart or
shutdown; the frozen daemon must be what dies, never the bystander.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.mps.control import PID_FILE, ControlProgram, process_alive
from gpuslice.mps.identity import DaemonHandle, IdentityError, boot_ticks, executable_key
from gpuslice.testing.eventually import eventually
from gpuslice.testing.logcapture import captured_events

from .conftest import wait_until
from .test_mps_manager import daemon_pid, manager_for, running, spec_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(SLEEPER)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def plant(pipe_dir: str, pid: int) -> None:
    Path(pipe_dir).mkdir(parents=True, exist_ok=True)
    (Path(pipe_dir) / PID_FILE).write_text(f"{pid}\n")


def assert_alive_not_killed(proc: subprocess.Popen[bytes]) -> None:
    assert proc.poll() is None, f"bystander ended with {proc.returncode}"
    assert process_alive(proc.pid)


async def test_planted_pid_survives_a_daemon_restart(
    sock_dir: Path, bystander: subprocess.Popen[bytes]
) -> None:
    spec = spec_for(sock_dir)
    manager = manager_for([spec], timeout_s=1.0)
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        real = daemon_pid(spec)
        assert real is not None
        os.kill(real, signal.SIGSTOP)  # hung: the health check fails, the restart must kill
        plant(spec.pipe_dir, bystander.pid)
        await wait_until(manager, lambda: not manager.ready(spec.resource), 10)
        await wait_until(manager, lambda: manager.ready(spec.resource), 15)
        assert not process_alive(real)  # the frozen daemon was killed through its pidfd
        new = daemon_pid(spec)
        assert new is not None
        assert new not in (real, bystander.pid)
        assert_alive_not_killed(bystander)
    assert_alive_not_killed(bystander)
    assert not process_alive(new)


async def test_planted_pid_survives_shutdown(
    sock_dir: Path, bystander: subprocess.Popen[bytes]
) -> None:
    spec = spec_for(sock_dir)
    manager = manager_for([spec], timeout_s=1.0)
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        real = daemon_pid(spec)
        assert real is not None
        os.kill(real, signal.SIGSTOP)  # `quit` goes unanswered: shutdown has to kill
        plant(spec.pipe_dir, bystander.pid)
    assert not process_alive(real)
    assert_alive_not_killed(bystander)


async def test_daemon_of_an_earlier_run_is_asked_to_quit_but_never_signalled(
    sock_dir: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """No identity to go on: a pid file found at start is never trusted."""
    spec = spec_for(sock_dir)
    plant(spec.pipe_dir, bystander.pid)
    manager = manager_for([spec], timeout_s=1.0)
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        assert_alive_not_killed(bystander)
    assert_alive_not_killed(bystander)


# -- the identity check itself -------------------------------------------------------------

PYTHON = executable_key(sys.executable)


def test_a_process_older_than_the_start_is_refused(bystander: subprocess.Popen[bytes]) -> None:
    after = boot_ticks() + 1000  # as if `-d` ran ten seconds after the bystander started
    with pytest.raises(IdentityError, match="started before"):
        DaemonHandle.adopt(str(bystander.pid), not_before=after, executable=PYTHON)


def test_a_new_process_running_another_program_is_refused() -> None:
    """A pid reused (or a process started by a pod) after `-d` ran: not the control program."""
    not_before = boot_ticks()
    other = subprocess.Popen(["sleep", "120"])
    try:
        with pytest.raises(IdentityError, match="executable"):
            DaemonHandle.adopt(str(other.pid), not_before=not_before, executable=PYTHON)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("text", ["", "abc", "-1", "1", "12 34", "9" * 40])
def test_pid_file_garbage_is_refused(text: str) -> None:
    with pytest.raises(IdentityError):
        DaemonHandle.adopt(text, not_before=0, executable=PYTHON)


def test_the_pidfd_outlives_the_pid() -> None:
    """Once the adopted process is gone, killing through its handle reaches no one."""
    not_before = boot_ticks()
    proc = subprocess.Popen(SLEEPER)
    handle = DaemonHandle.adopt(str(proc.pid), not_before=not_before, executable=PYTHON)
    try:
        assert not handle.exited()
        proc.kill()
        proc.wait()  # reaped: the pid is free for reuse now
        assert asyncio.run(handle.wait_exit(5.0))
        handle.kill()  # no error, and no process to reach
    finally:
        handle.close()


# -- a pid file `-d` left not yet written ----------------------------------------------------

LATE_PID = r"""
import ctypes, os, sys, time
pipe, logs = os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"]
pid_file = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
if sys.argv[1:] == ["-d"]:
    open(pid_file, "w").close()  # created, not yet written, when `-d` returns
    os.posix_spawn(sys.executable, [sys.executable, sys.argv[0], "daemon"], os.environ,
                   setsid=True)
    sys.exit(0)
if sys.argv[1:] == ["daemon"]:
    with open(os.path.join(logs, "daemon.pid"), "w") as f:
        f.write(str(os.getpid()))
    # the pid goes in only once the file was read (IN_CLOSE_NOWRITE): whoever read it
    # first, right after `-d` returned, found it empty
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init()
    libc.inotify_add_watch(watch, pid_file.encode(), 0x10)
    os.read(watch, 4096)
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(60)
sys.exit(1)  # a command: no daemon answers
"""


async def test_a_pid_file_not_yet_written_when_d_returns_is_waited_for(tmp_path: Path) -> None:
    """`-d` may return before the daemon wrote its pid: an empty file is read again until
    it holds the pid, and the daemon is pinned (not left unidentified, never to be killed)."""
    script = tmp_path / "control.py"
    script.write_text(LATE_PID)
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    logs.mkdir()
    control = ControlProgram(
        pipe, logs, command=(sys.executable, str(script)), timeout_s=5.0, quit_grace_s=1.0
    )
    side = logs / "daemon.pid"
    try:
        with captured_events() as events:
            await control.start_daemon()
        assert [e for e in events if e["event"] == "mps-daemon-unidentified"] == []
        await eventually(side.exists, "the daemon started")
        daemon = int(side.read_text())
        await control.terminate()  # `quit` goes unanswered: only a pinned daemon is killed
        assert not process_alive(daemon)
    finally:
        await eventually(side.exists, "the daemon started")
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(side.read_text()), signal.SIGKILL)
