"""docs/architecture.md, "Adding things", walked for a daemon setting the chart passes: on a
copy of the source, the chart, the docs and the drift tests, a throwaway knob is written as
its field, the generator runs, and the files that changed are counted; the copy's drift
tests (the chart's defaults, schema and knob names, knobs.json, the docs' tables) then pass
on it. Issue 42: a knob the chart passes needed its field, its value, its schema entry, the
template line and the docs' row by hand, with knobs.json generated; now 1 by hand and 5
generated."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SETTINGS = "src/gpuslice/agent/settings.py"
CHART = "deploy/helm/gpuslice"

FIELD = """    burst_s: float = knob(
        2.0,
        "--memory-guard-burst",
        env="MEMORY_GUARD_BURST",
        chart="memoryGuard.burst",
        type=click.FloatRange(min=0.5),
        show_default=True,
        help="Seconds of a throwaway burst allowance.",
    )

    @property
    def params(self) -> GuardParams:"""
DRIFT_TESTS = [
    "tests/chart/test_chart_defaults.py",
    "tests/chart/test_chart_knob_names.py",
    "tests/chart/test_chart_schema_is_the_knobs.py",
    "tests/chart/test_chart_extra_env.py::test_the_charts_knobs_file_is_the_agents",
    "tests/docs/test_docs_match_code.py",
    "tests/docs/test_docs_knob_defaults.py",
]


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _copy(root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    for tree in ("src/gpuslice", CHART, "docs", "tests/chart", "tests/docs"):
        shutil.copytree(ROOT / tree, root / tree, ignore=ignore)
    for one in (
        "pyproject.toml", "tests/__init__.py", "tests/conftest.py",
        "scripts/gen-chart-knobs", "scripts/check-chart",
    ):  # fmt: skip
        (root / one).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / one, root / one)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def test_a_chart_passed_setting_is_its_field_and_what_the_generator_writes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "repo"
    _copy(root)
    before = _files(root)

    # 1. its field, with its knob: flag, variable, default, range, help, chart value
    _edit(root / SETTINGS, "\n    @property\n    def params(self) -> GuardParams:", "\n" + FIELD)
    # 2. the rest is generated
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    generate = [sys.executable, str(root / "scripts/gen-chart-knobs")]
    subprocess.run(generate, check=True, capture_output=True, env=env)

    after = _files(root)
    touched = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert touched == [
        f"{CHART}/knobs.json",  # generated
        f"{CHART}/templates/daemonset.yaml",  # generated
        f"{CHART}/values.schema.json",  # generated
        f"{CHART}/values.yaml",  # generated
        "docs/configuration.md",  # generated
        SETTINGS,
    ]
    assert (
        b"| `--memory-guard-burst` | `MEMORY_GUARD_BURST` | `2` | Seconds of a throwaway burst"
        in after["docs/configuration.md"]
    )
    assert b'"minimum": 0.5' in after[f"{CHART}/values.schema.json"]
    assert (
        b"            - name: MEMORY_GUARD_BURST\n"
        b"              value: {{ .Values.memoryGuard.burst | quote }}\n"
        in after[f"{CHART}/templates/daemonset.yaml"]
    )
    assert (
        b"  # Seconds of a throwaway burst allowance.\n  burst: 2.0\n"
        in after[f"{CHART}/values.yaml"]
    )
    drift = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DRIFT_TESTS],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=False,
    )
    assert drift.returncode == 0, drift.stdout[-3000:]
