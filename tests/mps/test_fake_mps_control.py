"""The fake control program, driven through the real `ControlProgram` adapter.

The answers asserted here are the real `nvidia-cuda-mps-control`'s, read on an NVIDIA H200
with driver 580.159.04 (issue 32's closing note quotes that run): the fake must not let the
manager rely on anything the real program does not do."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpuslice.mps import ControlProgram, MpsError
from gpuslice.mps.control import PID_FILE, process_alive

from .conftest import FAKE_CONTROL


def _control(base: Path) -> ControlProgram:
    pipe, log = base / "pipe", base / "log"
    pipe.mkdir(exist_ok=True)
    log.mkdir(exist_ok=True)
    return ControlProgram(pipe, log, command=FAKE_CONTROL, timeout_s=10.0, quit_grace_s=2.0)


async def test_daemon_answers_and_remembers_limits(sock_dir: Path) -> None:
    control = _control(sock_dir)
    await control.start_daemon()
    try:
        pid = control.daemon_pid()
        assert pid is not None
        assert process_alive(pid)
        assert await control.send("get_default_active_thread_percentage") == "100.0"
        await control.send("set_default_active_thread_percentage 25")
        await control.send("set_default_device_pinned_mem_limit 0 4606M")
        assert await control.send("get_default_active_thread_percentage") == "25.0"
        # The real daemon prints a limit of 1024 MiB or more in whole GiB, rounded down.
        assert await control.send("get_default_device_pinned_mem_limit 0") == "4G"
        await control.send("set_default_device_pinned_mem_limit 0 1023M")
        assert await control.send("get_default_device_pinned_mem_limit 0") == "1023M"
        await control.send("set_default_device_pinned_mem_limit 0 2G")
        assert await control.send("get_default_device_pinned_mem_limit 0") == "2G"
        assert await control.send("get_default_device_pinned_mem_limit 1") == ""  # none set
        assert await control.send("ps") == "Server not found"
        assert await control.send("get_server_list") == ""
    finally:
        await control.terminate()
    assert not process_alive(pid)
    assert not (sock_dir / "pipe" / PID_FILE).exists()
    log = (sock_dir / "log" / "control.log").read_text()
    assert "Command: set_default_device_pinned_mem_limit 0 4606M" in log
    assert "Command: quit" in log


async def test_bad_commands_exit_0_and_change_nothing(sock_dir: Path) -> None:
    control = _control(sock_dir)
    await control.start_daemon()
    try:
        # Rejected or unknown commands still exit 0: only the answers tell.
        assert await control.send("shutdown_everything") == 'Unknown command "shutdown_everything"'
        assert await control.send("set_default_device_pinned_mem_limit 0 12X") == ""
        assert await control.send("get_default_device_pinned_mem_limit 0") == ""
        await control.send("set_default_active_thread_percentage 33.3")
        # Out of (0, 100]: the old value is kept, and printed as the answer.
        assert await control.send("set_default_active_thread_percentage 250") == "33.3"
        assert await control.send("set_default_active_thread_percentage 0") == "33.3"
        assert await control.send("get_default_active_thread_percentage") == "33.3"
    finally:
        await control.terminate()


async def test_no_daemon_means_exit_status_1(sock_dir: Path) -> None:
    control = _control(sock_dir)
    with pytest.raises(MpsError, match=r"exit status 1: Cannot find MPS control daemon process$"):
        await control.send("get_default_active_thread_percentage")


async def test_second_start_is_refused_while_one_runs(sock_dir: Path) -> None:
    control = _control(sock_dir)
    await control.start_daemon()
    try:
        with pytest.raises(MpsError, match="already running"):
            await control.start_daemon()
    finally:
        await control.terminate()


async def test_terminate_kills_a_daemon_that_does_not_answer(sock_dir: Path) -> None:
    control = ControlProgram(
        sock_dir / "pipe", sock_dir / "log", command=FAKE_CONTROL, timeout_s=1.0, quit_grace_s=0.5
    )
    (sock_dir / "pipe").mkdir()
    (sock_dir / "log").mkdir()
    await control.start_daemon()
    pid = control.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    with pytest.raises(MpsError, match="did not finish within 1 s"):
        await control.send("get_default_active_thread_percentage")
    await control.terminate()
    assert not process_alive(pid)
    assert control.daemon_pid() is None
    # A fresh daemon starts in the same directories after the stale one is gone.
    await control.start_daemon()
    try:
        assert await control.send("get_default_active_thread_percentage") == "100.0"
    finally:
        await control.terminate()


async def test_missing_program_is_reported_plainly(sock_dir: Path) -> None:
    control = ControlProgram(
        sock_dir, sock_dir, command=[str(sock_dir / "no-such-mps-control")], timeout_s=5.0
    )
    with pytest.raises(MpsError, match=r"cannot run .*no-such-mps-control -d"):
        await control.start_daemon()
