"""`extraEnv` is checked at `helm install` as the agent checks its variables at start, from
one source: `knobs.json` in the chart is written from the agent's knobs
(`gpuslice.cli.plugin.chart_knobs`, `scripts/gen-chart-knobs`). A variable the chart sets
from a value is refused with the value to set; a value the agent would refuse (not one of
its choices, not a number or a boolean, out of range) fails the install instead of
crash-looping the pod, and the checks the chart applies agree with click's own."""

from __future__ import annotations

import json
import re

import click
import pytest

from gpuslice.cli.plugin import CHART_KNOBS, FIELDS, GROUPS, chart_knobs, plugin
from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import check_chart, render


def test_the_charts_knobs_file_is_the_agents() -> None:
    written = (check_chart.CHART / CHART_KNOBS).read_text()
    assert written == json.dumps(chart_knobs(), indent=2, sort_keys=True) + "\n", (
        "stale: run scripts/gen-chart-knobs"
    )


CORPUS = [
    "0", "1", "0.05", "0.1", "2.5", "60", "3600", "3601", "100000", "100001", "65535", "70000",
    "-1", "1e3", ".5", " 5 ", "many", "", "true", "False", "on", "no", "maybe", "auto", "off",
    "strict", "borrow", "observe",
]  # fmt: skip


def chart_takes(check: Json, value: str) -> bool:
    """The template's verdict (`gpuslice.validateExtraEnv`), in Python."""
    if "enum" in check and value not in check["enum"]:
        return False
    if "pattern" in check and not re.search(check["pattern"], value):
        return False
    if "min" in check and not (
        float(value) > check["min"] if check.get("minOpen") else float(value) >= check["min"]
    ):
        return False
    return not ("max" in check and float(value) > check["max"])


def agent_takes(option: click.Option, value: str) -> bool:
    try:
        option.type_cast_value(click.Context(plugin), value)
    except click.BadParameter:
        return False
    return True


def test_the_charts_checks_agree_with_the_agents() -> None:
    knobs = chart_knobs()
    compared = 0
    for group in GROUPS:
        for f, option in FIELDS[group]:
            check = knobs.get(str(f.knob.env), {})
            if option is None or not {"enum", "pattern"} & set(check):
                continue
            for value in CORPUS:
                assert chart_takes(check, value) == agent_takes(option, value), (
                    f"{f.knob.env}={value!r}"
                )
                compared += 1
    assert compared > 500


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "MEMORY_GUARD", "value": "enforce"},
            "extraEnv[0] sets MEMORY_GUARD, which the chart sets from memoryGuard.mode: "
            "set memoryGuard.mode instead",
        ),
        (
            {"name": "INVENTORY_INTERVAL", "value": "0"},
            'extraEnv[0] INVENTORY_INTERVAL="0" (--inventory-interval): the agent takes at '
            "least 0.1",
        ),
        (
            {"name": "HTTP_MAX_PER_ADDRESS", "value": "many"},
            'extraEnv[0] HTTP_MAX_PER_ADDRESS="many" (--http-max-per-address): the agent would '
            "refuse it (it takes a number)",
        ),
        (
            {"name": "PASS_DEVICE_SPECS", "value": "maybe"},
            'extraEnv[0] PASS_DEVICE_SPECS="maybe" (--pass-device-specs): the agent would '
            "refuse it (it takes a boolean)",
        ),
        (
            {"name": "HTTP_HEAD_TIMEOUT", "value": "0"},
            'extraEnv[0] HTTP_HEAD_TIMEOUT="0" (--http-head-timeout): the agent takes more than 0',
        ),
    ],
)
def test_extra_env_the_agent_would_refuse_fails_the_install(
    entry: dict[str, str], message: str
) -> None:
    result = render(extraEnv=[entry])
    assert not result.ok
    assert f"chart validation: {message}" in result.problems, result.problems


def test_extra_env_the_agent_takes_renders_as_given() -> None:
    entries = [
        {"name": "INVENTORY_INTERVAL", "value": "60"},
        {"name": "PASS_DEVICE_SPECS", "value": "True"},
        {"name": "NOT_A_KNOB", "value": "anything"},
        {"name": "HTTP_MAX_PER_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    result = render(extraEnv=entries)
    assert result.ok, result.problems
