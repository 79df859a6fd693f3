"""Memory hints for time-sliced replicas: env vars that frameworks honour.

Nothing caps CUDA memory per container under time-slicing, so the first line of defence
is telling well-written programs their share before they allocate:

* `TF_FORCE_GPU_ALLOW_GROWTH=true`: TensorFlow otherwise maps almost all GPU memory at
  start (the crash in NVIDIA/k8s-device-plugin#461);
* `XLA_PYTHON_CLIENT_MEM_FRACTION=<share>`: JAX otherwise preallocates 75 %;
* `GPUSLICE_GPU_FRACTION=<share>` and `GPUSLICE_MEMORY_LIMIT_MIB=<MiB>` for programs that
  size themselves (vLLM: `--gpu-memory-utilization "$GPUSLICE_GPU_FRACTION"`).

The share is the container's fraction of each device it holds replicas on (held/replicas,
of a whole GPU or of a time-sliced MIG device, which is all the container sees);
with replicas on several GPUs, the smallest (the per-device limit that binds). Fractions
are rounded down to 4 digits so the hint never exceeds the share.

A pod that sets one of these variables itself keeps its own value: the kubelet puts device
plugin envs first and the container's `env` after them in the CRI `ContainerConfig`, and
both containerd (`oci.WithEnv`) and CRI-O (runtime-tools `AddProcessEnv`) replace an
existing key, so the later, the pod's, wins (docs/memory-guard.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from gpuslice.core.sharing.model import AdvertisedDevice

SOFT_LIMIT_ENVS = (
    "GPUSLICE_GPU_FRACTION",
    "GPUSLICE_MEMORY_LIMIT_MIB",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
)


def soft_limit_envs(devices: Sequence[AdvertisedDevice]) -> dict[str, str]:
    """The hints for the time-sliced replicas among `devices` (empty when there are none)."""
    held: Counter[str] = Counter()
    by_gpu: dict[str, AdvertisedDevice] = {}
    for dev in devices:
        if dev.replica is None or dev.replicas <= 1 or dev.mps is not None:
            continue
        held[dev.physical.uuid] += 1
        by_gpu[dev.physical.uuid] = dev
    if not held:
        return {}
    fractions = []
    limits = []
    for uuid, n in held.items():
        dev = by_gpu[uuid]
        fraction = min(1.0, n / dev.replicas)
        fractions.append(fraction)
        if dev.physical.memory_reported:  # unified memory: no MiB figure to hint at
            limits.append(dev.physical.memory_mib * n // dev.replicas)
    share = f"{math.floor(min(fractions) * 10_000) / 10_000:.4f}".rstrip("0").rstrip(".")
    envs = {
        "GPUSLICE_GPU_FRACTION": share,
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": share,
    }
    if limits:
        envs["GPUSLICE_MEMORY_LIMIT_MIB"] = str(min(limits))
    return dict(sorted(envs.items()))
