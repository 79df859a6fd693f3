"""The chart value a knob names in the agent's errors (`Knob.chart`) is the value the
DaemonSet template passes in that knob's variable: an error that sends a chart user to
`metrics.port` must be about the variable `metrics.port` sets."""

from __future__ import annotations

import re
from pathlib import Path

from gpuslice.cli.plugin import FIELDS, GROUPS

TEMPLATE = (
    Path(__file__).resolve().parents[2] / "deploy/helm/gpuslice/templates/daemonset.yaml"
).read_text()

_VALUE = re.compile(r"- name: (\w+)\n\s+value: \{\{[^}\n]*?\.Values\.([\w.]+)")
_WITH = re.compile(
    r"\{\{- (?:with|if not \(kindIs \"invalid\"|if) \.Values\.([\w.]+)[^\n]*\n"
    r"\s+(?:#[^\n]*\n\s+)?- name: (\w+)\n\s+value: \{\{ \.(?: |\|)"
)


def passed_by_the_chart() -> dict[str, str]:
    """Variable -> the value the template fills it from."""
    found = dict(_VALUE.findall(TEMPLATE))
    found |= {env: value for value, env in _WITH.findall(TEMPLATE)}
    # `value: "true"` inside `if .Values.<value>`
    found |= {"DRA": "dra.enabled", "GFD_NO_TIMESTAMP": "labels.noTimestamp"}
    return found


def test_each_knobs_chart_value_is_the_one_the_template_passes() -> None:
    chart = passed_by_the_chart()
    named = {
        str(f.knob.env): f.knob.chart for group in GROUPS for f, _ in FIELDS[group] if f.knob.chart
    }
    assert len(named) >= 25
    for env, value in named.items():
        assert chart.get(env) == value, f"{env}: the knob names {value}, the chart {chart.get(env)}"
    assert sorted(set(chart) - set(named)) == [], "a value the chart passes has no chart name"
