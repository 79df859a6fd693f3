"""The seed documents' configs end to end: parse -> plan -> labels on simulated nodes.

Expected values are the labels the seed documents show on their real nodes.
"""

from __future__ import annotations

import pytest

from gpuslice.backends.simulated.node import build_inventory
from gpuslice.backends.simulated.nodespec import parse_spec
from gpuslice.core.config import parse_config
from gpuslice.core.labels import gfd_labels
from gpuslice.core.sharing.plan import build_plan

T4_TIME_SLICING = """
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
L40S_MPS = """
version: v1
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 10
"""
A100_MIG_SINGLE = """
version: v1
flags:
  migStrategy: "single"
"""
T4_RENAMED = """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def labels_for(node: str, config: str) -> dict[str, str]:
    inventory = build_inventory(parse_spec(node))
    plan = build_plan(inventory, parse_config(config))
    return gfd_labels(inventory, plan, timestamp=None, machine_type=inventory.machine_type)


@pytest.mark.parametrize(
    ("node", "config", "expected"),
    [
        (
            "4xt4",
            T4_TIME_SLICING,
            {
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.product": "Tesla-T4-SHARED",
                "nvidia.com/gpu.replicas": "4",
            },
        ),
        (
            "4xt4",
            T4_RENAMED,
            {
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.replicas": "4",
            },
        ),
        (
            "1xl40s",
            L40S_MPS,
            {
                "nvidia.com/gpu.product": "NVIDIA-L40S-SHARED",
                "nvidia.com/gpu.replicas": "10",
                "nvidia.com/gpu.sharing-strategy": "mps",
                "nvidia.com/mps.capable": "true",
            },
        ),
        (
            "1xa100-80gb/mig=1g.10gb*7",
            A100_MIG_SINGLE,
            {
                "nvidia.com/gpu.count": "7",
                "nvidia.com/gpu.memory": "9728",
                "nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb",
                "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.strategy": "single",
            },
        ),
    ],
)
def test_seed_labels(node: str, config: str, expected: dict[str, str]) -> None:
    labels = labels_for(node, config)
    assert {k: labels.get(k) for k in expected} == expected
