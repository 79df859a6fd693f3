"""Values the chart used to accept and the agent (or the API server) then refused, so the
install "succeeded" into a CrashLoopBackOff: each is now refused at `helm install`, with the
value to change named.

- a `nodeSelector` value `--set` made a boolean (the migration guide's own command);
- a memory guard reserve the agent cannot read (`4GB`): the schema's pattern is the agent's
  (`RESERVE_PATTERN`), checked here against the same corpus;
- `metrics.port` equal to `probes.port` (the agent refuses it);
- `hostNetwork` with `metrics.port` 9400, dcgm-exporter's port on the node."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from gpuslice.core.errors import GpusliceError
from gpuslice.core.guard.model import RESERVE_PATTERN, Reserve
from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import SETS, check_chart, render

DOCS = Path(__file__).resolve().parents[2] / "docs"


def schema_problems(**overrides: Any) -> list[str]:
    problems: list[str] = check_chart.schema_problems(
        check_chart.deep_merge(SETS["default"], overrides)
    )
    return problems


def test_a_boolean_node_selector_is_refused_by_the_schema() -> None:
    problems = schema_problems(nodeSelector={"gpuslice.io/migrate": True})
    assert any("nodeSelector.gpuslice.io/migrate" in p for p in problems), problems
    assert schema_problems(nodeSelector={"gpuslice.io/migrate": "true"}) == []


def _helm_sets(command: str) -> Json:
    """The values a `helm install` line's --set / --set-string flags give, typed as Helm
    types them (--set: true/false are booleans; --set-string: strings), after the shell has
    read the line (an unquoted `\\.` loses its backslash there)."""
    values: Json = {}
    args = shlex.split(command.strip().strip("`"))
    for flag, pair in itertools.pairwise(args):
        if flag not in ("--set", "--set-string") or "=" not in pair:
            continue
        key, value = pair.split("=", 1)
        parts = re.split(r"(?<!\\)\.", key)
        typed: Any = value
        if flag == "--set" and value in ("true", "false"):
            typed = value == "true"
        node = values
        for part in parts[:-1]:
            node = node.setdefault(part.replace("\\.", "."), {})
        node[parts[-1].replace("\\.", ".")] = typed
    return values


def test_the_migration_guides_install_line_passes_the_schema() -> None:
    guide = (DOCS / "migrating-from-nvidia.md").read_text()
    [line] = [ln for ln in guide.splitlines() if "helm install" in ln and "nodeSelector" in ln]
    sets = _helm_sets(line)
    assert sets["nodeSelector"] == {"gpuslice.io/migrate": "true"}, line
    assert schema_problems(**sets) == []


RESERVES = ["10%", "0%", "99.5%", " 5% ", "4Gi", "512MiB", "1 gib", "4294967296", "100B"]
NOT_RESERVES = ["4GB", "100%", "150%", "ten", "4 G", "-1", "4Gi!", "%"]


@pytest.mark.parametrize("text", RESERVES + NOT_RESERVES)
def test_the_schema_reads_a_reserve_as_the_agent_does(text: str) -> None:
    try:
        Reserve.parse(text)
        agent_takes = True
    except GpusliceError:
        agent_takes = False
    assert agent_takes == (text in RESERVES)
    problems = schema_problems(memoryGuard={"reserve": text})
    assert (problems == []) == agent_takes, problems
    if not agent_takes:
        assert any("memoryGuard.reserve" in p for p in problems), problems


def test_the_schemas_reserve_pattern_is_the_agents() -> None:
    schema = check_chart.json.loads((check_chart.CHART / "values.schema.json").read_text())
    reserve = schema["properties"]["memoryGuard"]["properties"]["reserve"]
    assert reserve["pattern"] == r"^\s*(?:" + RESERVE_PATTERN + r")\s*$"


def test_the_metrics_port_equal_to_the_probes_port_is_refused() -> None:
    result = render(metrics={"port": 9401})
    assert not result.ok
    assert any(
        p.startswith("chart validation: metrics.port and probes.port are both 9401")
        for p in result.problems
    ), result.problems


def test_host_network_on_dcgm_exporters_port_is_refused() -> None:
    result = render(hostNetwork=True)
    assert not result.ok
    assert any(
        p.startswith("chart validation: hostNetwork=true binds metrics.port 9400")
        and "set metrics.port" in p
        for p in result.problems
    ), result.problems
    assert render(hostNetwork=True, metrics={"port": 9402}).ok
