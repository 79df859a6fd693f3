"""What the advise tests share: the end of the synthetic history, the CLI runner, and the
answers known by construction (checked alike from a samples file and from Prometheus)."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.core.jsontypes import Json

END = float(int(time.time()) // 15 * 15 - 60)
"""A minute ago, on the scrape grid: the data ends "now", within any retention."""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def by_model(out: str) -> dict[str, Json]:
    return {m["model"]: m for m in json.loads(out)["models"]}


def check_known_answers(models: dict[str, Json]) -> None:
    """Shared with the real-Prometheus test: the same answers from both sources."""
    h100 = models["NVIDIA H100 80GB HBM3"]
    assert h100["time_slicing"]["replicas"] == 8
    assert h100["leakers"] == ["ml/leaky"]
    assert h100["current_replicas"] == 4
    assert h100["mps"]["pinned_memory_limit_mib"] == 81559 // 8
    assert {d["pod"] for d in h100["dra"]} == {f"ml/train-{i}" for i in range(6)}
    assert h100["mig"]["instances"] == {"1g.20gb": 6}
    assert sorted(p["peak_mib"] for p in h100["pods"] if p["pod"] != "ml/leaky") == [9216] * 6
    rec = h100["replay"]["recommended"]
    assert rec["stopped_by_guard"] == ["ml/leaky"]
    assert rec["oom_with_guard"] == []
    assert rec["gpus"] == 1
    assert rec["whole_gpus"] == 7
    assert h100["replay"]["current"]["gpus"] == 2
    l40s = models["NVIDIA L40S"]
    assert l40s["idle"] is True
    assert l40s["time_slicing"] is None
    assert len(l40s["idle_pods"]) == 4
