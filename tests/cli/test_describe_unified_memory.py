"""`gpuslice describe` on a unified-memory GPU (`sim:1xgb10`, a GB10 whose memory NVML does
not report): no made-up 0 GiB, the note on why its memory features are off, and in DRA mode
(`--claims`) a share offered by count, with no memory figure and no guard on it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuslice.cli.main import main

TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)
CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""


def describe(tmp_path: Path, *args: str) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(TS4, encoding="utf-8")
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, ["describe", "--node", "sim:1xgb10", "--config-file", str(config), *args]
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_the_table_says_unified_and_why_memory_is_off(tmp_path: Path) -> None:
    out = describe(tmp_path)
    assert "n/a (unified)" in out
    assert "0 GiB" not in out
    assert "no nvidia.com/gpu.memory label" in " ".join(out.split())


def test_a_claim_gets_a_share_by_count_and_no_guard(tmp_path: Path) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(CLAIM, encoding="utf-8")
    out = describe(tmp_path, "--claims", str(claims))
    assert "4 shares (by count: no memory capacity)" in out
    assert "guarded" in out  # "no memory figure, not guarded", wrapped in its cell
    doc = json.loads(describe(tmp_path, "--claims", str(claims), "-o", "json"))
    (device,) = doc["claims"][0]["devices"]
    assert device["sharing_text"] == "1 of 4 shares (time-slicing), no memory figure"
    assert "GPUSLICE_MEMORY_LIMIT_MIB" not in device["env"]
    assert device["env"]["GPUSLICE_GPU_FRACTION"] == "0.25"
