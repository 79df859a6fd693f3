"""Knowing which process is the MPS control daemon this agent started, and signalling only it.

The daemon's pid file lies in the pipe directory, which every MPS client container mounts
read-write, so its content is whatever a pod last wrote. The pid is therefore read once,
right after `nvidia-cuda-mps-control -d` returned, and accepted only for a process that
started after the agent ran `-d` and runs the same executable as the control program. A
pidfd opened then (and the identity checked again through it) pins that process: a later
signal goes through the pidfd, so neither a rewritten pid file nor a reused pid can
redirect it.
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

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def _file_key(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def executable_key(program: str) -> tuple[int, int]:
    """The (device, inode) of the program the control command runs, as `exec` finds it."""
    found = shutil.which(program)
    if found is None:
        raise IdentityError(f"control program {program!r} not found on PATH")
    return _file_key(found)


@dataclass(slots=True)
class DaemonHandle:
    """The control daemon as seen when it started: pid, start time, and a pidfd to it."""

    pid: int
    started: int
    pidfd: int

    @classmethod
    def adopt(cls, pid_text: str, *, not_before: int, executable: tuple[int, int]) -> DaemonHandle:
        """Take the pid from a fresh pid file, only if it is the daemon we just started.

        `not_before` is `boot_ticks()` from before `-d` ran (one tick of slack for the
        rounding of both clocks); `executable` is the control program's file key.
        """
        text = pid_text.strip()
        if not text.isdigit() or len(text) > 10:
            raise IdentityError("pid file does not hold a pid")
        pid = int(text)
        if pid <= 1 or pid == os.getpid():
            raise IdentityError(f"pid file names pid {pid}, which is not a daemon")
        try:
            started = start_ticks(pid)
            pidfd = os.pidfd_open(pid)
        except (OSError, ValueError, IndexError) as exc:
            raise IdentityError(f"pid {pid} from the pid file cannot be inspected: {exc}") from None
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

    def exited(self) -> bool:
        """True once the process ended (a pidfd turns readable at exit, zombie or reaped)."""
        if self.pidfd < 0:
            return True
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return bool(ready)

    def kill(self) -> None:
        """SIGKILL through the pidfd: reaches this process or nothing."""
        if self.pidfd >= 0:
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
