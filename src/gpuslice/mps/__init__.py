"""Adapter: starting, configuring, watching and restarting `nvidia-cuda-mps-control`. The
plain `nvidia-smi` settings (compute mode, time-slice interval) live in `gpuslice.nvsmi`."""

from gpuslice.aio.programs import ProgramError as MpsError
from gpuslice.mps.control import ControlProgram, MpsControl, MpsControlFactory
from gpuslice.mps.manager import DaemonState, MpsDaemonManager, MpsTimings
from gpuslice.mps.readiness import Readiness, ReadinessListener

__all__ = [
    "ControlProgram",
    "DaemonState",
    "MpsControl",
    "MpsControlFactory",
    "MpsDaemonManager",
    "MpsError",
    "MpsTimings",
    "Readiness",
    "ReadinessListener",
]
