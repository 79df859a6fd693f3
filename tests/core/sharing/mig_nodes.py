"""Facts and helpers the MIG tests share: the MIG User Guide's tables, and sim inventories.

The expected numbers are written out here from the guide (REFERENCE.md Part 2 §2.1), not read
from the simulator's own tables, so a wrong table entry fails these tests.
"""

from __future__ import annotations

from pathlib import Path

from gpuslice.backends import open_backend
from gpuslice.core.config import Config, parse_config
from gpuslice.core.devices import Inventory
from tests.mig_guide import MAX_INSTANCES

SEEDS = Path(__file__).resolve().parents[2] / "configs" / "seeds"

"""Model -> profile -> most instances of it on one GPU (MIG User Guide v580)."""

MIXED_LAYOUTS: dict[str, tuple[str, dict[str, int]]] = {
    # mig-parted's "balanced" layouts: one 3g, one 2g, two 1g (A30: one 2g, two 1g).
    "a100-40gb": ("3g.20gb+2g.10gb+1g.5gb*2", {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}),
    "a100-80gb": ("3g.40gb+2g.20gb+1g.10gb*2", {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}),
    "a30": ("2g.12gb+1g.6gb*2", {"2g.12gb": 1, "1g.6gb": 2}),
    "h100-80gb": ("3g.40gb+2g.20gb+1g.10gb*2", {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}),
    "h200": ("3g.71gb+2g.35gb+1g.18gb*2", {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}),
}
"""Model -> (a layout with several profiles, instances per profile in it)."""

PRODUCTS = {
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100 80GB PCIe",
    "a30": "NVIDIA A30",
    "h100-80gb": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
}

MIG_MODELS = tuple(sorted(MAX_INSTANCES))


def inventory(spec: str) -> Inventory:
    backend = open_backend(spec)
    try:
        return backend.inventory()
    finally:
        backend.close()


def mig_resource(profile: str) -> str:
    """NVIDIA's mixed-strategy name: `nvidia.com/mig-<profile>` with `+` written `.`."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def strategy_config(strategy: str, extra: str = "") -> Config:
    return parse_config(f"version: v1\nflags:\n  migStrategy: {strategy}\n{extra}")


def seed(name: str) -> Config:
    path = SEEDS / name
    return parse_config(path.read_text(encoding="utf-8"), source=path.name)
