"""Running a short-lived helper program (the MPS control client, nvidia-smi) from asyncio.

Output goes to temporary files rather than pipes: `nvidia-cuda-mps-control -d` leaves a
daemon behind that may inherit the child's stdout, and reading a pipe to its end would
then wait for the daemon to exit. Every child is reaped, also on timeout and cancellation.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO


class ProgramError(Exception):
    """A control command or helper program failed; the message says which and why. The MPS
    adapter and the nvidia-smi wrappers raise it (as `MpsError`, the name callers catch)."""


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode(errors="replace").strip()


async def run_program(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin_text: str | None,
    timeout_s: float,
) -> Completed:
    """Run `argv` to its end; ProgramError when it cannot start or outlives `timeout_s`."""
    shown = " ".join(argv)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE
                if stdin_text is not None
                else asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env),
            )
        except OSError as exc:
            raise ProgramError(f"cannot run `{shown}`: {exc}") from None
        try:
            data = stdin_text.encode() if stdin_text is not None else None
            await asyncio.wait_for(proc.communicate(data), timeout_s)
        except TimeoutError:
            raise ProgramError(f"`{shown}` did not finish within {timeout_s:g} s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return Completed(proc.returncode or 0, _read(out), _read(err))
