"""Setting a GPU's time-slice interval, for DRA claims that ask for one.

A DRA claim can carry NVIDIA's `timeSlicingConfig.interval` (Default, Short, Medium, Long:
0-3). The driver exposes it only through `nvidia-smi compute-policy --set-timeslice`, which
needs root and fails on GPUs without the feature (NVIDIA's DRA driver failed whole claims
on Tesla P4s for it: kubernetes-sigs/dra-driver-nvidia-gpu#41, #81, #363). The setter
reports the tool's own message; what to do with a failure is the caller's decision.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Protocol

from gpuslice.core.dra.sharing import INTERVALS
from gpuslice.mps.process import MpsError, run_program


class TimesliceSetter(Protocol):
    async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
        """Set the interval (0-3); MpsError carrying the tool's message when that fails."""
        ...


class NvidiaSmiTimeslice:
    """`nvidia-smi compute-policy -i <uuid> --set-timeslice <0-3>`."""

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

    async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
        if interval not in INTERVALS.values():
            raise MpsError(f"time-slice interval must be 0-3, got {interval!r}")
        done = await run_program(
            (*self._command, "compute-policy", "-i", gpu_uuid, "--set-timeslice", str(interval)),
            env=self._env,
            stdin_text=None,
            timeout_s=self._timeout_s,
        )
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise MpsError(message)
