"""The opaque-config corpus (tests/configs/claims/opaque-configs.yaml) and the verdict a
prepare gives each entry; the real API server's admission policy is checked against the same
verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuslice.core.dra.sharing import ClaimConfigError, resolve
from gpuslice.core.jsontypes import Json

CORPUS = Path(__file__).parents[2] / "configs" / "claims" / "opaque-configs.yaml"
DRIVER = "gpu.nvidia.com"


def corpus() -> list[Json]:
    return list(yaml.safe_load(CORPUS.read_text())["configs"])


def prepare_verdict(raw: str) -> str:
    """`accept` or `refuse`, as Prepare decides on a claim carrying this config (read from
    the API server's JSON, as the driver reads it)."""
    allocation = json.loads(json.dumps({"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}],
        "config": [{"source": "FromClaim", "requests": [], "opaque": {
            "driver": DRIVER, "parameters": "PARAMETERS"}}],
    }}).replace('"PARAMETERS"', raw))  # fmt: skip
    try:
        resolve(allocation, DRIVER, {"gpu-0": "gpu"})
    except ClaimConfigError:
        return "refuse"
    return "accept"
