"""Talking to one `nvidia-cuda-mps-control` daemon through its control program.

The control program is the only interface NVIDIA documents: `-d` starts the daemon, and
every other use pipes commands on stdin to the daemon found through
`CUDA_MPS_PIPE_DIRECTORY`. The command is configurable as an argument list so tests and
the demo run the fake in `gpuslice.testing.fake_mps_control` through the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gpuslice.core.mps import MpsDaemonSpec
from gpuslice.mps.process import MpsError, run_program

PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULT_COMMAND = ("nvidia-cuda-mps-control",)


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
    ) -> None:
        if not command:
            raise ValueError("the MPS control command must not be empty")
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self._command = tuple(command)
        self._env = {
            **(os.environ if env is None else env),
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(log_dir),
        }
        self._timeout_s = timeout_s
        self._quit_grace_s = quit_grace_s

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
            )

        return make

    async def start_daemon(self) -> None:
        done = await run_program(
            (*self._command, "-d"), env=self._env, stdin_text=None, timeout_s=self._timeout_s
        )
        if done.returncode != 0:
            detail = done.stderr or done.stdout or "no output"
            raise MpsError(f"`{self._shown} -d` exited with status {done.returncode}: {detail}")

    async def send(self, command: str) -> str:
        done = await run_program(
            self._command, env=self._env, stdin_text=command + "\n", timeout_s=self._timeout_s
        )
        if done.returncode != 0:
            detail = done.stderr or done.stdout or "no output"
            raise MpsError(
                f"MPS command `{command}` failed with exit status {done.returncode}: {detail}"
            )
        return done.stdout

    async def terminate(self) -> None:
        """`quit`, then SIGKILL whatever the pid file still names after the grace period.

        The pid is only visible where this process shares the daemon's PID namespace
        (NVIDIA runs its MPS daemon with hostPID for the same reason); elsewhere `quit` is
        all that can be done.
        """
        pid = self.daemon_pid()  # read first: the daemon removes its pid file as it quits
        with contextlib.suppress(MpsError):  # dead or hung: the pid decides below
            await self.send("quit")
        if pid is not None:
            if not await self._gone(pid, self._quit_grace_s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                await self._gone(pid, self._quit_grace_s)
            if not process_alive(pid):
                (self.pipe_dir / PID_FILE).unlink(missing_ok=True)

    def daemon_pid(self) -> int | None:
        """The pid in the daemon's pid file, if that process still runs."""
        try:
            pid = int((self.pipe_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if process_alive(pid) else None

    @property
    def _shown(self) -> str:
        return " ".join(self._command)

    @staticmethod
    async def _gone(pid: int, within_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while process_alive(pid):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True
