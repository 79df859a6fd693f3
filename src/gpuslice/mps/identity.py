"""Knowing which process is the MPS control daemon this agent started, and signalling only it.

The daemon's pid file lies in the pipe directory, which every MPS client container mounts
read-write, so its content is whatever a pod last wrote. The pid is therefore read once,
right after `nvidia-cuda-mps-control -d` returned, and accepted only for a process that
started after the agent ran `-d` and runs the same executable as the control program. A
pidfd opened then (and the identity checked again through it) pins that process: a later
signal goes through the pidfd, so neither a rewritten pid file nor a reused pid can
redirect it.

A daemon an earlier agent started (taken over after a restart) is pinned the same way when
the pid names a process that runs the control program's executable and was started for
this pipe directory, but only to know whether it still runs: it is never signalled. The pid
file itself is only ever read bounded (`read_bounded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gpuslice.textfile import UnreadableFile, read_bytes

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

PID_FILE_LIMIT = 64
"""The most of a pid file ever read: a pid is at most 10 digits, and a pod may have replaced
the file with anything (a link to /dev/zero, a FIFO, gigabytes)."""


class IdentityError(Exception):
    """The pid file does not name the daemon this agent started; the message says why."""


def boot_ticks() -> int:
    """Now, in the clock `/proc/<pid>/stat` start times use (ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLOCK_TICKS)


def start_ticks(pid: int) -> int:
    """Field 22 of `/proc/<pid>/stat`: when the process started, in ticks since boot."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the command name, which may itself hold spaces and parentheses.
    return int(stat.rsplit(")", 1)[-1].split()[19])


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of a small file under `textfile`'s rules, and never through a symlink: a
    pod that can write the pipe directory must not make the agent block or read without
    end. Each refusal is an `IdentityError` naming the path."""
    try:
        return read_bytes(path, limit, follow_symlinks=False)
    except UnreadableFile as exc:
        raise IdentityError(str(exc)) from None


def read_pid_file(path: Path) -> str:
    """The daemon's pid file as text, read by `read_bounded` with `PID_FILE_LIMIT`."""
    return read_bounded(path, PID_FILE_LIMIT).decode("ascii", errors="replace")


def _pinned(pid: int) -> tuple[int, int]:
    """(start time, pidfd) of `pid`; check the start time again after any inspection."""
    try:
        started = start_ticks(pid)
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError, IndexError) as exc:
        raise IdentityError(f"pid {pid} from the pid file cannot be inspected: {exc}") from None
    return started, pidfd


def _file_key(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def executable_key(program: str) -> tuple[int, int]:
    """The (device, inode) of the program the control command runs, as `exec` finds it."""
    found = shutil.which(program)
    if found is None:
        raise IdentityError(f"control program {program!r} not found on PATH")
    return _file_key(found)


_ENVIRON_LIMIT = 1 << 20
"""The most of a daemon's `/proc/<pid>/environ` read when taking it over."""


def _pid_of(pid_text: str) -> int:
    text = pid_text.strip()
    if not text.isdigit() or len(text) > 10:
        raise IdentityError("pid file does not hold a pid")
    pid = int(text)
    if pid <= 1 or pid == os.getpid():
        raise IdentityError(f"pid file names pid {pid}, which is not a daemon")
    return pid


def _environ_has(pid: int, entry: str) -> bool:
    """Whether the process was started with `entry` (`NAME=value`) in its environment."""
    wanted = entry.encode()
    with open(f"/proc/{pid}/environ", "rb") as f:  # a kernel file: it ends
        return wanted in f.read(_ENVIRON_LIMIT).split(b"\0")


@dataclass(slots=True)
class DaemonHandle:
    """The control daemon as seen when it started: pid, start time, and a pidfd to it.

    `owned` is false for a daemon an earlier agent started (taken over): the pidfd then
    only tells whether it still runs, and `kill` does nothing, since how it came to be
    cannot be checked the way a fresh start's can."""

    pid: int
    started: int
    pidfd: int
    owned: bool = True

    @classmethod
    def adopt(cls, pid_text: str, *, not_before: int, executable: tuple[int, int]) -> DaemonHandle:
        """Take the pid from a fresh pid file, only if it is the daemon we just started.

        `not_before` is `boot_ticks()` from before `-d` ran (one tick of slack for the
        rounding of both clocks); `executable` is the control program's file key.
        """
        pid = _pid_of(pid_text)
        started, pidfd = _pinned(pid)
        try:
            # Checked after the pidfd pins the process: a pid reused in between fails here.
            if start_ticks(pid) != started:
                raise IdentityError(f"pid {pid} was reused while it was inspected")
            if started + 1 < not_before:
                raise IdentityError(
                    f"pid {pid} started before the agent ran the control program, "
                    "so it is not the daemon that run started"
                )
            try:
                exe = _file_key(f"/proc/{pid}/exe")
            except OSError as exc:
                raise IdentityError(f"executable of pid {pid} cannot be read: {exc}") from None
            if exe != executable:
                raise IdentityError(f"pid {pid} does not run the control program's executable")
        except BaseException:
            os.close(pidfd)
            raise
        return cls(pid, started, pidfd)

    @classmethod
    def running(cls, pid_text: str, *, executable: tuple[int, int], pipe_dir: Path) -> DaemonHandle:
        """A daemon left by an earlier agent that answers in `pipe_dir`, watched (not owned).

        Accepted only for a process running the control program's executable that was
        started with `CUDA_MPS_PIPE_DIRECTORY=<pipe_dir>`: a pid a pod planted names some
        other process, which fails one of the two."""
        pid = _pid_of(pid_text)
        started, pidfd = _pinned(pid)
        try:
            try:
                exe = _file_key(f"/proc/{pid}/exe")
                serves = _environ_has(pid, f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}")
            except OSError as exc:
                raise IdentityError(f"pid {pid} cannot be inspected: {exc}") from None
            if start_ticks(pid) != started:
                raise IdentityError(f"pid {pid} was reused while it was inspected")
            if exe != executable:
                raise IdentityError(f"pid {pid} does not run the control program's executable")
            if not serves:
                raise IdentityError(f"pid {pid} was not started for the pipe directory {pipe_dir}")
        except BaseException:
            os.close(pidfd)
            raise
        return cls(pid, started, pidfd, owned=False)

    def exited(self) -> bool:
        """True once the process ended (a pidfd turns readable at exit, zombie or reaped)."""
        if self.pidfd < 0:
            return True
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return bool(ready)

    def kill(self) -> None:
        """SIGKILL through the pidfd: reaches this process or nothing (nothing for a daemon
        taken over: see `owned`)."""
        if self.pidfd >= 0 and self.owned:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    async def wait_exit(self, within_s: float) -> bool:
        """Wait up to `within_s` for the process to end; True when it did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not self.exited():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
