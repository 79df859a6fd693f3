"""The chart's values against the settings' knobs (`agent.knobs`): every variable the chart
passes the agent is one `gpuslice plugin` reads, and where the chart passes a knob's
default it passes the same value, unless listed below with the reason it differs. A default
changed on one side only fails here instead of drifting."""

from __future__ import annotations

from typing import Any

import click
import pytest

from gpuslice.cli.plugin import FIELDS, GROUPS, plugin
from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import env_of, one, render

DELIBERATE = {
    "GFD_OUTPUT_FILE": "the chart writes where NFD reads, as NVIDIA's chart does; unset, the "
    "daemon takes the config's flags.gfd.outputFile",
    "METRICS_PORT": "the kubelet's probes need the endpoint; a standalone daemon serves none",
    "HEALTH_PORT": "the probes' own listener in the chart; standalone, none",
    "MPS_ROOT": "NVIDIA's Helm value; unset, the config's flags.mpsRoot applies",
    "DRA": "set where dra.enabled asks for DRA mode",
    "DRA_PLUGIN_DIR": "the chart names the directory it mounts; the daemon derives the same",
    "MEMORY_CAPS": "caps grant CAP_SYS_ADMIN and the host's cgroup tree, and the chart grants "
    "nothing no value asks for: off unless memoryCaps.mode is auto",
    "MEMORY_CAPS_HOOK_SEEN_AT": "where the chart mounts the hook's host directory (DRA)",
}
NOT_THE_AGENTS = {
    "NVIDIA_VISIBLE_DEVICES": "the container runtime's",
    "NVIDIA_DRIVER_CAPABILITIES": "the container runtime's",
    "NVIDIA_MIG_MONITOR_DEVICES": "the container runtime's",
}


def _knobs() -> dict[str, tuple[Any, click.Option | None]]:
    return {
        str(f.knob.env): (f.cli_default, option)
        for group in GROUPS
        for f, option in FIELDS[group]
        if f.knob.env
    }


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"dra": {"enabled": True}},
        {"memoryCaps": {"mode": "auto"}},
        {"dra": {"enabled": True}, "memoryCaps": {"mode": "auto"}},
    ],
    ids=["default", "dra", "caps", "dra-caps"],
)
def test_the_charts_values_are_the_knobs_defaults(values: Json) -> None:
    knobs = _knobs()
    env = env_of(one(render(**values), "DaemonSet"))
    ctx = click.Context(plugin)
    compared = 0
    for name, value in sorted(env.items()):
        if name in NOT_THE_AGENTS:
            continue
        assert name in knobs, f"the chart passes {name}, which `gpuslice plugin` does not read"
        if not isinstance(value, str) or name in DELIBERATE:
            continue  # from the downward API, or a listed difference
        default, option = knobs[name]
        given = value if option is None else option.type_cast_value(ctx, value)
        if option is not None and default is not None:
            default = option.type_cast_value(ctx, default)
        assert given == default, f"{name}: the chart says {value!r}, the knob {default!r}"
        compared += 1
    assert compared >= 12  # not vacuous: most of the chart's variables are compared
