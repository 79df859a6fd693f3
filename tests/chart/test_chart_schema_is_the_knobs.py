"""The chart's `values.schema.json` entry of each value that sets a knob's variable says what
the agent takes in that variable (issue 42 item 7): its type, a choice's values, a range's
bounds, from the knob itself (`gpuslice.cli.plugin.chart_schema`, the checks `knobs.json`
is written from). A bound changed on one side only (a schema minimum of 0.01 against the
agent's 0.1) fails here instead of letting `helm install` through into a crash loop; a
pattern in the schema takes nothing the agent refuses. Where the chart's value is shaped
otherwise than the variable, it is listed with the reason."""

from __future__ import annotations

import json
import re
from typing import Any

import click
import pytest

from gpuslice.cli.plugin import FIELDS, GROUPS, chart_schema, plugin
from gpuslice.core.errors import GpusliceError
from tests.chart.chart_support import check_chart

SCHEMA = json.loads((check_chart.CHART / "values.schema.json").read_text())
SHAPED_OTHERWISE = {
    "config.fallbackStrategies": "a list, as NVIDIA's Helm value is; the template joins it "
    "with commas",
    "deviceListStrategy": "NVIDIA's Helm value: one strategy or a list of them, joined with "
    "commas by the template",
    "memoryGuard.reserve": "also a number of bytes (an integer, at least 0); its pattern is "
    "the agent's RESERVE_PATTERN (test_chart_refuses_what_the_agent_refuses.py)",
    "metrics.port": "0 (a free port, for tests) is no port the kubelet's probes or the "
    "Service could follow",
    "probes.port": "0 (a free port, for tests) is no port the kubelet's probes could follow",
}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def entry_of(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] = SCHEMA
    for part in path.split("."):
        found = node.get("properties", {}).get(part)
        if found is None:
            return None
        node = found
    return node


def types_of(entry: dict[str, Any]) -> set[str]:
    """The JSON types an entry admits: its `type`, its enum's values' and its branches'."""
    named = entry.get("type", [])
    found = {named} if isinstance(named, str) else set(named)
    json_type = {str: "string", bool: "boolean", int: "integer", float: "number"}
    found |= {json_type[type(v)] for v in entry.get("enum", []) if v is not None}
    for branch in entry.get("anyOf", []):
        found |= types_of(branch)
    return found


@pytest.mark.parametrize("path", sorted(chart_schema()))
def test_each_knob_values_schema_entry_is_the_knobs(path: str) -> None:
    wanted = chart_schema()[path]
    entry = entry_of(path)
    assert entry is not None, f"values.schema.json has no {path}: run scripts/gen-chart-knobs"
    if path in SHAPED_OTHERWISE:
        return
    if "enum" in wanted:
        assert set(entry.get("enum", [])) - {None} == set(wanted["enum"]), path
    else:
        assert wanted["type"] in types_of(entry), (path, wanted["type"], types_of(entry))
    for bound in BOUNDS:
        assert entry.get(bound) == wanted.get(bound), f"{path}: {bound}"


def test_the_checks_compare_bounds() -> None:
    """Not vacuous: ranges and choices are among the entries compared."""
    wanted = chart_schema()
    assert len(wanted) >= 30
    assert sum(1 for w in wanted.values() if "minimum" in w) >= 3
    assert sum(1 for w in wanted.values() if "enum" in w) >= 7


CORPUS = [
    "replicas", "memory", "5", "007", " 5 ", "0", "-1", "1.5", "", "/abs", "/abs/", "rel",
    "gpu.nvidia.com", "Gpu.Nvidia.com", "a" * 64, "/usr/bin/nvidia-cdi-hook", "10%", "4Gi",
    "4GB", "true", "on",
]  # fmt: skip


def _agent_takes(path: str, value: str) -> bool:
    ctx = click.Context(plugin)
    for group in GROUPS:
        for f, option in FIELDS[group]:
            if f.knob.chart != path:
                continue
            try:
                given = value if option is None else option.type_cast_value(ctx, value)
                f.value(given)
            except (click.BadParameter, ValueError, GpusliceError):
                return False
    return True


def test_a_schema_pattern_takes_nothing_the_agent_refuses() -> None:
    compared = 0
    for path in chart_schema():
        entry = entry_of(path)
        if entry is None or "pattern" not in entry:
            continue
        for value in CORPUS:
            if re.search(entry["pattern"], value):
                assert _agent_takes(path, value), f"the schema takes {path}={value!r}"
                compared += 1
    assert compared >= 10
