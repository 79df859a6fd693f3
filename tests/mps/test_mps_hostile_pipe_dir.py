"""The pipe directory is mounted read-write into every MPS client container: what a pod does
there (a pid file that never ends or blocks, a removed control socket) must neither take the
agent down nor cut the other pods' clients.

The pid file is read only as `read_bounded` allows (no symlink, non-blocking, a regular file,
64 bytes), so each hostile file below is refused by the reader's contract, before any byte
of it is read; none of these reads could end otherwise on the unfixed code (a FIFO blocks
the open, `/dev/zero` fills memory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.mps import ControlProgram
from gpuslice.mps.control import PID_FILE, SOCKET_NAME, process_alive
from gpuslice.mps.identity import PID_FILE_LIMIT, IdentityError, read_pid_file
from gpuslice.testing.eventually import eventually

from .conftest import FAKE_CONTROL, wait_until
from .test_mps_manager import manager_for, probe, read, running, spec_for

HOSTILE = {
    "dev-zero-link": "path.symlink_to('/dev/zero')",
    "fifo": "os.mkfifo(path)",
    "huge": "open(path, 'wb').truncate(1 << 30)",  # sparse: a gigabyte that costs no disk
    "long-line": f"path.write_text('1' * {PID_FILE_LIMIT + 1})",
    "symlink": "(path.parent / 'elsewhere').write_text('1234'); path.symlink_to('elsewhere')",
    "directory": "path.mkdir()",
}
"""What a pod can leave as the pid file, as Python run with `path` bound to it."""

PLANT = "import os, sys; from pathlib import Path; path = Path(sys.argv[1]); "


def plant(name: str, path: Path) -> None:
    subprocess.run([sys.executable, "-c", PLANT + HOSTILE[name], str(path)], check=True)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_pid_file_is_refused_by_the_reader(tmp_path: Path, name: str) -> None:
    pid_file = tmp_path / PID_FILE
    plant(name, pid_file)
    with pytest.raises(IdentityError) as err:
        read_pid_file(pid_file)
    assert str(pid_file) in str(err.value)
    control = ControlProgram(tmp_path, tmp_path, command=FAKE_CONTROL)
    assert control.daemon_pid() is None


def test_a_small_pid_file_is_read(tmp_path: Path) -> None:
    (tmp_path / PID_FILE).write_text(f"{os.getpid()}\n")
    assert read_pid_file(tmp_path / PID_FILE).strip() == str(os.getpid())


def hostile_start(tmp_path: Path, name: str) -> ControlProgram:
    """A control program whose `-d` leaves the named hostile file as the pid file, as a pod
    that replaced it does with a real daemon writing through what it finds there."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    code = (
        "import os; from pathlib import Path; "
        f"path = Path(os.environ['CUDA_MPS_PIPE_DIRECTORY']) / {PID_FILE!r}; " + HOSTILE[name]
    )
    return ControlProgram(pipe, tmp_path, command=(sys.executable, "-c", code))


@pytest.mark.parametrize("name", ["dev-zero-link", "fifo", "huge"])
async def test_a_hostile_pid_file_after_start_leaves_the_daemon_unpinned(
    tmp_path: Path, name: str
) -> None:
    """`-d` returned and the pid file is whatever a pod made of it: the agent reads at most
    64 bytes of a regular file, so the start ends (unpinned: only `quit` will reach it)."""
    control = hostile_start(tmp_path, name)
    await control.start_daemon()
    assert control.lost_socket() is False  # nothing pinned: nothing to judge by
    assert control.daemon_pid() is None


@pytest.mark.parametrize("how", ["removed", "replaced-by-a-file"])
async def test_a_removed_control_socket_does_not_restart_a_live_daemon(
    sock_dir: Path, how: str
) -> None:
    """A pod removes `pipe/control` (or puts a file in its place) and links the pid file to
    /dev/zero: the daemon, still serving its clients, keeps running (same pid, no second
    start); its replicas are not ready meanwhile, and the manager says why."""
    spec = spec_for(sock_dir)
    manager = manager_for([spec], keep_running=True)
    pipe = Path(spec.pipe_dir)
    log = Path(spec.log_dir) / "control.log"
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        pid = probe(spec).daemon_pid()
        assert pid is not None
        (pipe / SOCKET_NAME).unlink()
        if how == "replaced-by-a-file":
            (pipe / SOCKET_NAME).write_text("not a socket\n")
        (pipe / PID_FILE).unlink()
        (pipe / PID_FILE).symlink_to("/dev/zero")
        await wait_until(manager, lambda: not manager.ready(spec.resource), 10)
        await wait_until(
            manager, lambda: any("lost its control socket" in p for p in manager.problems), 10
        )
        assert process_alive(pid)
        assert read(log).count("Started") == 1, read(log)
    assert process_alive(pid)  # left for the next agent, as a daemon that answers is
    assert read(log).count("Started") == 1, read(log)
    os.kill(
        pid, signal.SIGKILL
    )  # the test's own cleanup: its socket is gone, nobody can ask it to quit


async def test_a_taken_over_daemon_that_lost_its_socket_is_not_restarted(sock_dir: Path) -> None:
    """After a rollout the daemon is one the previous agent started: the new agent pins it
    when it takes it over (its executable and its pipe directory), so a removed socket is
    told from a dead daemon as for one it started. An agent that starts while the socket is
    already gone leaves the daemon too."""
    spec = spec_for(sock_dir)
    log = Path(spec.log_dir) / "control.log"
    first = manager_for([spec], keep_running=True)
    async with running(first):
        await wait_until(first, lambda: first.ready(spec.resource), 10)
        pid = probe(spec).daemon_pid()
    assert pid is not None
    second = manager_for([spec], keep_running=True)
    async with running(second):
        await wait_until(second, lambda: second.ready(spec.resource), 10)
        (Path(spec.pipe_dir) / SOCKET_NAME).unlink()
        await wait_until(second, lambda: not second.ready(spec.resource), 10)
        assert any("lost its control socket" in p for p in second.problems), second.problems
    assert process_alive(pid)
    third = manager_for([spec], keep_running=True)
    async with running(third):
        # nothing changes readiness here (it never was ready): follow the reports instead
        await eventually(
            lambda: any("lost its control socket" in p for p in third.problems),
            "the lost-control-socket problem reported",
        )
        assert not third.ready(spec.resource)
    assert process_alive(pid)
    assert read(log).count("Started") == 1, read(log)
    os.kill(pid, signal.SIGKILL)  # cleanup: with its socket gone, nothing can ask it to quit
