"""Adapter: starting, configuring, watching and restarting `nvidia-cuda-mps-control`, and the
other `nvidia-smi` settings sharing needs (compute mode, time-slice interval)."""

from gpuslice.mps.compute_mode import ComputeMode, ComputeModeSetter, NvidiaSmiComputeMode
from gpuslice.mps.control import ControlProgram, MpsControl, MpsControlFactory
from gpuslice.mps.manager import MpsDaemonManager, MpsTimings
from gpuslice.mps.process import MpsError
from gpuslice.mps.readiness import Readiness, ReadinessListener
from gpuslice.mps.timeslice import NvidiaSmiTimeslice, TimesliceSetter

__all__ = [
    "ComputeMode",
    "ComputeModeSetter",
    "ControlProgram",
    "MpsControl",
    "MpsControlFactory",
    "MpsDaemonManager",
    "MpsError",
    "MpsTimings",
    "NvidiaSmiComputeMode",
    "NvidiaSmiTimeslice",
    "Readiness",
    "ReadinessListener",
    "TimesliceSetter",
]
