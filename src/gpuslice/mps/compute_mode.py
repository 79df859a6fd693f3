"""Setting a GPU's compute mode around its MPS daemon.

NVIDIA recommends EXCLUSIVE_PROCESS so only the MPS server can open the GPU, and its
device plugin sets it before starting a daemon and resets DEFAULT on stop. MPS works
without it, so a failure (no root, no nvidia-smi) is reported and the daemon still starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from gpuslice.mps.process import MpsError, run_program

ComputeMode = Literal["DEFAULT", "EXCLUSIVE_PROCESS"]


class ComputeModeSetter(Protocol):
    async def set_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        """Set the mode; MpsError carrying the tool's own message when that fails."""
        ...


class NvidiaSmiComputeMode:
    """`nvidia-smi -i <uuid> -c <mode>` (needs root on the host's GPUs)."""

    def __init__(
        self,
        command: Sequence[str] = ("nvidia-smi",),
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._command = tuple(command)
        self._env = dict(os.environ if env is None else env)
        self._timeout_s = timeout_s

    async def set_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        done = await run_program(
            (*self._command, "-i", gpu_uuid, "-c", mode),
            env=self._env,
            stdin_text=None,
            timeout_s=self._timeout_s,
        )
        if done.returncode != 0:
            raise MpsError(done.stderr or done.stdout or f"exit status {done.returncode}")
