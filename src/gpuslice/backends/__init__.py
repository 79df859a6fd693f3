"""GPU backends: NVML on real nodes, a simulated node everywhere else.

`open_backend` turns the `--node` setting into a backend, so the agent, the CLI and the demo
never choose a class themselves:

- `nvml`: the real GPUs, through nvidia-ml-py;
- `sim:COUNTxMODEL[/mig=LAYOUT][,...]`: a simulated node (see `simulated.nodespec`);
- `sim:/path/node.yaml` or `/path/node.yaml`: a simulated node from a YAML node file.

A simulated node polls a control directory when the caller names one (the daemon's
`GPUSLICE_SIM_CONTROL_DIR` setting) or the node file does (`controlDir`; see
`simulated.control`).
"""

from __future__ import annotations

from pathlib import Path

from gpuslice.backends.simulated import (
    SimulatedBackend,
    load_node_file,
    parse_spec,
)
from gpuslice.backends.simulated.models import known_models
from gpuslice.ports import BackendError, GpuBackend, MemoryLimiter

__all__ = ["BackendError", "memory_limiter_of", "open_backend"]

_ACCEPTED = (
    "use 'nvml', 'sim:COUNTxMODEL[/mig=LAYOUT][,...]' (e.g. sim:2xt4, "
    "sim:1xa100-80gb/mig=1g.10gb*7; models: {models}), or the path of a YAML node file"
)


def open_backend(spec: str, *, control_dir: Path | None = None) -> GpuBackend:
    """Open the backend `spec` names; BackendError says what is accepted when it is wrong.
    `control_dir` is where a simulated node polls for injected events."""
    text = spec.strip()
    if text == "nvml":
        from gpuslice.backends.nvml import NvmlBackend

        return NvmlBackend()
    rest = text.removeprefix("sim:") if text.startswith("sim:") else None
    if rest is not None and not _looks_like_path(rest):
        if not rest:
            raise BackendError(f"empty simulated node spec {spec!r}; " + _accepted())
        return SimulatedBackend(parse_spec(rest), control_dir=control_dir)
    path_text = rest if rest is not None else text
    if not path_text or (rest is None and not _looks_like_path(path_text)):
        raise BackendError(f"unknown backend {spec!r}; " + _accepted())
    node = load_node_file(Path(path_text).expanduser())
    return SimulatedBackend(node, control_dir=control_dir)


def memory_limiter_of(backend: GpuBackend) -> MemoryLimiter | None:
    """The per-cgroup memory limits of a backend: NVML's (sharing its session) or the
    simulator's own; None for a backend without them (a test double)."""
    if isinstance(backend, SimulatedBackend):
        return backend
    make = getattr(backend, "memory_limiter", None)
    if callable(make):
        limiter: MemoryLimiter = make()
        return limiter
    return None


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text.endswith((".yaml", ".yml"))


def _accepted() -> str:
    return _ACCEPTED.format(models=known_models())
