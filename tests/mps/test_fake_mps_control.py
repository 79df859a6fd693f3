"""The fake control program, driven through the real `ControlProgram` adapter."""

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
        assert await control.send("get_default_device_pinned_mem_limit 0") == "4606M"
        assert (await control.send("ps")).split()[:2] == ["PID", "ID"]
        assert await control.send("get_server_list") == ""
    finally:
        await control.terminate()
    assert not process_alive(pid)
    assert not (sock_dir / "pipe" / PID_FILE).exists()
    log = (sock_dir / "log" / "control.log").read_text()
    assert "Command: set_default_device_pinned_mem_limit 0 4606M" in log
    assert "Command: quit" in log


async def test_rejects_unknown_commands_and_bad_values(sock_dir: Path) -> None:
    control = _control(sock_dir)
    await control.start_daemon()
    try:
        with pytest.raises(MpsError, match="Unrecognized command: shutdown_everything"):
            await control.send("shutdown_everything")
        with pytest.raises(MpsError, match="invalid memory limit: 12X"):
            await control.send("set_default_device_pinned_mem_limit 0 12X")
        with pytest.raises(MpsError, match="out of range"):
            await control.send("set_default_active_thread_percentage 250")
        # The daemon survives bad commands.
        assert await control.send("get_default_active_thread_percentage") == "100.0"
    finally:
        await control.terminate()


async def test_no_daemon_means_exit_status_1(sock_dir: Path) -> None:
    control = _control(sock_dir)
    with pytest.raises(MpsError, match="exit status 1"):
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
