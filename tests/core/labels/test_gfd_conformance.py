"""Labels where gpuslice once differed from GPU Feature Discovery, each checked against the
GFD behaviour (file and test) it now follows."""

from __future__ import annotations

import dataclasses

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.devices import Inventory
from gpuslice.core.labels import gfd_labels
from gpuslice.core.sharing.plan import build_plan

TS4 = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"


def _inventory(spec: str) -> Inventory:
    backend = open_backend(spec)
    try:
        return backend.inventory()
    finally:
        backend.close()


def _labels(spec: str, config: str = "") -> dict[str, str]:
    inv = _inventory(spec)
    return gfd_labels(inv, build_plan(inv, parse_config(config)), timestamp=None, machine_type="")


def test_gpu_mode_follows_the_pci_class_like_gfd_nvml_go() -> None:
    """GFD `internal/lm/nvml.go` (TestGPUModeLabeler): 0x030000 (VGA) is `graphics`, 0x030200
    (3D controller) is `compute`, mixed classes or another class are `unknown`."""
    assert _labels("sim:1xrtx-3060")["nvidia.com/gpu.mode"] == "graphics"  # seed 004
    assert _labels("sim:2xt4")["nvidia.com/gpu.mode"] == "compute"
    assert _labels("sim:1xa100-80gb")["nvidia.com/gpu.mode"] == "compute"
    assert _labels("sim:1xrtx-3060,1xt4")["nvidia.com/gpu.mode"] == "unknown"
    inv = _inventory("sim:1xt4")
    switch = dataclasses.replace(inv.gpus[0], pci_class=0x068000)
    odd = dataclasses.replace(inv, gpus=(switch,))
    labels = gfd_labels(odd, build_plan(odd, parse_config("")), timestamp=None, machine_type="")
    assert labels["nvidia.com/gpu.mode"] == "unknown"


def test_mig_enabled_gpu_under_none_is_not_shared_like_gfd_mig_strategy_go() -> None:
    """GFD `internal/lm/mig-strategy.go` (TestMigStrategyNoneLabels): a MIG-enabled GPU is
    labelled without sharing, even with time-slicing configured: replicas 0, strategy none,
    no -SHARED."""
    labels = _labels("sim:1xa100-80gb/mig=1g.10gb*7", TS4)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe"
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.count"] == "1"
    # The same GPU out of MIG mode is shared as configured.
    shared = _labels("sim:1xa100-80gb", TS4)
    assert shared["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-SHARED"
    assert shared["nvidia.com/gpu.replicas"] == "4"


def test_mixed_counts_gpus_by_product_like_gfd_mig_strategy_go() -> None:
    """GFD `internal/lm/mig-strategy.go` (newGPULabelers): `gpu.count` counts GPUs of the
    product whether MIG is on or not, so one MIG A100 next to a whole A100 gives 2."""
    labels = _labels("sim:1xa100-80gb/mig=1g.10gb*7,1xa100-80gb", "flags:\n  migStrategy: mixed\n")
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "7"
