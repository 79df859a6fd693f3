"""The plain `nvidia-smi` settings sharing needs: a GPU's compute mode and its time-slice
interval.

Compute mode: NVIDIA recommends EXCLUSIVE_PROCESS so only the MPS server can open the GPU,
and its device plugin sets it before starting a daemon and resets DEFAULT on stop. MPS works
without it, so a failure (no root, no nvidia-smi) is reported and the daemon still starts.

Time-slice interval: a DRA claim can carry NVIDIA's `timeSlicingConfig.interval` (Default,
Short, Medium, Long: 0-3). The driver exposes it only through `nvidia-smi compute-policy
--set-timeslice`, which needs root and fails on GPUs without the feature (NVIDIA's DRA
driver failed whole claims on Tesla P4s for it: kubernetes-sigs/dra-driver-nvidia-gpu#41,
#81, #363). The setter reports the tool's own message; what to do with a failure is the
caller's decision.

One wrapper for both, so the `--nvidia-smi` command reaches every use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from gpuslice.aio.programs import ProgramError, run_program
from gpuslice.core.dra.sharing import INTERVALS
from gpuslice.ports import ComputeMode


class NvidiaSmi:
    """The `ports.ComputeModeSetter` and `ports.TimesliceSetter` of a real node:
    `nvidia-smi -i <uuid> -c <mode>` and `nvidia-smi compute-policy -i <uuid>
    --set-timeslice <0-3>` (both need root on the host's GPUs)."""

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
            raise ProgramError(done.stderr or done.stdout or f"exit status {done.returncode}")

    async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
        if interval not in INTERVALS.values():
            raise ProgramError(f"time-slice interval must be 0-3, got {interval!r}")
        done = await run_program(
            (*self._command, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(interval)),
            env=self._env,
            stdin_text=None,
            timeout_s=self._timeout_s,
        )
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise ProgramError(message)
