"""Talking to one `nvidia-cuda-mps-control` daemon through its control program.

The control program is the only interface NVIDIA documents: `-d` starts the daemon, and
every other use pipes commands on stdin to the daemon found through
`CUDA_MPS_PIPE_DIRECTORY`. The command is configurable as an argument list so tests and
the demo run the fake in `gpuslice.emulator.fake_mps_control` through the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from structlog.stdlib import BoundLogger

from gpuslice.aio.programs import ProgramError as MpsError
from gpuslice.aio.programs import run_program
from gpuslice.core.mps import MpsDaemonSpec
from gpuslice.logs import get_logger
from gpuslice.mps.identity import (
    DaemonHandle,
    IdentityError,
    boot_ticks,
    executable_key,
    read_pid_file,
)

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_NAME = "control"
"""The daemon's control socket in the pipe directory, where clients (and `send`) reach it."""
DEFAULT_COMMAND = ("nvidia-cuda-mps-control",)
_PID_POLL_S = 0.02
"""How often a pid file not yet written is looked at again after `-d` returned."""


class MpsControl(Protocol):
    """One daemon's control channel, bound to its pipe and log directories."""

    async def start_daemon(self) -> None:
        """Start the daemon in the background; MpsError if the program says it failed."""
        ...

    async def send(self, command: str) -> str:
        """Send one command and return the answer; MpsError on failure or no answer."""
        ...

    async def terminate(self) -> None:
        """Ask the daemon to quit; kill it if it does not (a hung daemon must not linger)."""
        ...

    def watch_running(self) -> None:
        """Pin a daemon an earlier agent left answering, to know later whether it still runs
        (never to signal it); a daemon that cannot be identified is left unpinned."""
        ...

    def lost_socket(self) -> bool:
        """True when the pinned daemon still runs but its control socket is gone: a pod
        removed it. Restarting would cut every client; not restarting cuts none."""
        ...


MpsControlFactory = Callable[[MpsDaemonSpec], MpsControl]


def process_alive(pid: int) -> bool:
    """True for a running or stopped process; a zombie (not yet reaped by init) is dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


class ControlProgram:
    """`nvidia-cuda-mps-control` (or a stand-in) for the daemon in `pipe_dir`."""

    def __init__(
        self,
        pipe_dir: Path,
        log_dir: Path,
        *,
        command: Sequence[str] = DEFAULT_COMMAND,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        quit_grace_s: float = 5.0,
        logger: BoundLogger | None = None,
        visible_devices: Sequence[str] = (),
        start_args: Sequence[str] = ("-d",),
    ) -> None:
        """`visible_devices`: the daemon's `CUDA_VISIBLE_DEVICES` (a MIG daemon's MIG
        devices); empty leaves the variable as `env` has it. `start_args`: `-d`, with `-M`
        for a multi-user daemon (`MpsDaemonSpec.start_args`)."""
        if not command:
            raise ValueError("the MPS control command must not be empty")
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self._command = tuple(command)
        self._start_args = tuple(start_args)
        self._env = {
            **(os.environ if env is None else env),
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(log_dir),
        }
        if visible_devices:
            self._env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_devices)
        self._timeout_s = timeout_s
        self._quit_grace_s = quit_grace_s
        self._log = logger or get_logger("gpuslice.mps")
        self._daemon: DaemonHandle | None = None
        """The daemon this object started, pinned by a pidfd; the only process it signals."""

    @classmethod
    def factory(
        cls,
        command: Sequence[str] = DEFAULT_COMMAND,
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        quit_grace_s: float = 5.0,
    ) -> MpsControlFactory:
        """What `MpsDaemonManager` takes: one `ControlProgram` per daemon spec."""

        def make(spec: MpsDaemonSpec) -> MpsControl:
            return cls(
                Path(spec.pipe_dir),
                Path(spec.log_dir),
                command=command,
                env=env,
                timeout_s=timeout_s,
                quit_grace_s=quit_grace_s,
                visible_devices=spec.mig_uuids,
                start_args=spec.start_args,
            )

        return make

    async def start_daemon(self) -> None:
        """`-d` (`-d -M` multi-user), then pin the daemon it left: see
        `gpuslice.mps.identity` for why."""
        not_before = boot_ticks()
        done = await run_program(
            (*self._command, *self._start_args),
            env=self._env,
            stdin_text=None,
            timeout_s=self._timeout_s,
        )
        if done.returncode != 0:
            detail = done.stderr or done.stdout or "no output"
            shown = " ".join((self._shown, *self._start_args))
            raise MpsError(f"`{shown}` exited with status {done.returncode}: {detail}")
        await self._pid_written()
        self._adopt(not_before)

    async def _pid_written(self) -> None:
        """Wait, within the program's timeout, while the pid file is missing or empty: `-d`
        may return before the daemon has written it, and a file caught mid-write is not
        yet written, not a file that names no daemon. What it then holds, `_adopt` judges."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        while not self._pid_file_written():
            if loop.time() >= deadline:
                return  # `_adopt` says what it holds
            await asyncio.sleep(_PID_POLL_S)

    def _pid_file_written(self) -> bool:
        """Whether the pid file holds something, or is there and refused (a link, a FIFO):
        no wait would make that a pid."""
        path = self.pipe_dir / PID_FILE
        try:
            return bool(read_pid_file(path).strip())
        except IdentityError:
            return os.path.lexists(path)

    def _adopt(self, not_before: int) -> None:
        if self._daemon is not None:
            self._daemon.close()
            self._daemon = None
        try:
            text = read_pid_file(self.pipe_dir / PID_FILE)
            self._daemon = DaemonHandle.adopt(
                text, not_before=not_before, executable=executable_key(self._command[0])
            )
        except (OSError, IdentityError) as exc:
            self._log.warning(
                "mps-daemon-unidentified",
                pipe_dir=str(self.pipe_dir),
                action="quit_only_never_signal",
                reason=str(exc),
            )

    def watch_running(self) -> None:
        if self._daemon is not None or not os.path.lexists(self.pipe_dir / PID_FILE):
            return
        try:
            text = read_pid_file(self.pipe_dir / PID_FILE)
            self._daemon = DaemonHandle.running(
                text, executable=executable_key(self._command[0]), pipe_dir=self.pipe_dir
            )
        except (OSError, IdentityError) as exc:
            self._log.warning(
                "mps-daemon-unidentified",
                pipe_dir=str(self.pipe_dir),
                action="taken_over_unpinned",
                reason=str(exc),
            )

    def lost_socket(self) -> bool:
        daemon = self._daemon
        if daemon is None or daemon.exited():
            return False
        try:  # removed, or replaced by something else (a file, a symlink)
            return not stat.S_ISSOCK(os.lstat(self.pipe_dir / SOCKET_NAME).st_mode)
        except OSError:
            return True

    async def send(self, command: str, *, timeout_s: float | None = None) -> str:
        done = await run_program(
            self._command,
            env=self._env,
            stdin_text=command + "\n",
            timeout_s=self._timeout_s if timeout_s is None else timeout_s,
        )
        if done.returncode != 0:
            detail = done.stderr or done.stdout or "no output"
            raise MpsError(
                f"MPS command `{command}` failed with exit status {done.returncode}: {detail}"
            )
        return done.stdout

    async def terminate(self) -> None:
        """`quit`, then SIGKILL the daemon this object started if it outlives the grace period.

        The signal goes through the pidfd taken when the daemon started, never to the pid
        in the pid file (a pod can write that file). A daemon this object did not start (one
        left by an earlier agent) is only asked to quit, and waited for when it was pinned by
        `watch_running`: its identity cannot be established as firmly as a fresh start's.
        """
        daemon = self._daemon
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._quit_grace_s  # for `quit` and the exit both
        with contextlib.suppress(MpsError):  # dead or hung: the pidfd decides below
            await self.send("quit", timeout_s=self._quit_grace_s)
        if daemon is None:
            return
        if not daemon.owned:
            await daemon.wait_exit(max(0.0, deadline - loop.time()))
            if daemon.exited():
                daemon.close()
                self._daemon = None
            return
        if not await daemon.wait_exit(max(0.0, deadline - loop.time())):
            self._log.warning(
                "mps-daemon-kill",
                pipe_dir=str(self.pipe_dir),
                pid=daemon.pid,
                reason="quit_timeout",
            )
            daemon.kill()
            await daemon.wait_exit(self._quit_grace_s)
        if daemon.exited():
            daemon.close()
            self._daemon = None
            (self.pipe_dir / PID_FILE).unlink(missing_ok=True)

    def daemon_pid(self) -> int | None:
        """The pid in the daemon's pid file, if that process still runs.

        For people and tests looking at a node: anyone who can write the pipe directory
        can write this number, so nothing here signals it.
        """
        try:
            pid = int(read_pid_file(self.pipe_dir / PID_FILE).strip())
        except (IdentityError, ValueError):
            return None
        return pid if process_alive(pid) else None

    @property
    def _shown(self) -> str:
        return " ".join(self._command)
