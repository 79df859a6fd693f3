"""A simulated GPU node: real models' facts, MIG placement rules, injectable faults and load.

Tests and `gpuslice demo` run the same agent code against it as against NVML; the contract
suite in tests/backends keeps the two honest. Node specs and files: `nodespec`; the control
directory for driving a daemon in another process: `control`.
"""

from gpuslice.backends.simulated.backend import SimulatedBackend
from gpuslice.backends.simulated.control import ControlDir
from gpuslice.backends.simulated.models import MODELS, GpuModel, MigGeometry, MigProfile
from gpuslice.backends.simulated.nodespec import NodeSpec, load_node_file, parse_spec

__all__ = [
    "MODELS",
    "ControlDir",
    "GpuModel",
    "MigGeometry",
    "MigProfile",
    "NodeSpec",
    "SimulatedBackend",
    "load_node_file",
    "parse_spec",
]
