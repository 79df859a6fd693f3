"""`describe` and `labels` take the daemon's settings from the same knobs as `gpuslice
plugin` (issue 42 item 7): one generator, so a flag, its variable, its default and its help
are the daemon's, and describe reads `MEMORY_CAPS` and `MEMORY_GUARD` as the daemon does
(through its options) instead of from the environment by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from gpuslice.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src/gpuslice/cli"


def _options(name: str) -> dict[str, click.Option]:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    return {
        flag: p
        for p in command.params
        if isinstance(p, click.Option)
        for flag in (*p.opts, *p.secondary_opts)
    }


def _as_declared(option: click.Option) -> tuple[Any, ...]:
    return (
        option.envvar,
        option.default,
        option.help,
        option.is_flag,
        repr(option.type),
        option.show_default,
    )


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (
            "describe",
            {
                "--config-file", "--config-name", "--default-config", "--node",
                "--consumable-shares",
                "--cgroup-root", "--memory-caps", "--memory-guard",
            },
        ),
        (
            "labels",
            {"--config-file", "--config-name", "--default-config", "--node", "--no-timestamp"},
        ),
    ],
)  # fmt: skip
def test_each_daemon_flag_of_an_offline_command_is_the_daemons(
    command: str, flags: set[str]
) -> None:
    daemon = _options("plugin")
    own = _options(command)
    shared = set(own) & set(daemon)
    assert shared == flags
    for flag in sorted(shared):
        assert _as_declared(own[flag]) == _as_declared(daemon[flag]), flag


def _describe(tmp_path: Path, *args: str, env: dict[str, str]) -> tuple[int, str]:
    node = tmp_path / "node.yaml"
    node.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n', encoding="utf-8")
    result = CliRunner(env=env).invoke(main, ["describe", "--node", str(node), "-o", "json", *args])
    return result.exit_code, result.output


def test_describe_takes_the_caps_and_guard_modes_as_flags(tmp_path: Path) -> None:
    code, out = _describe(tmp_path, "--memory-caps", "off", "--memory-guard", "enforce", env={})
    assert code == 0, out
    [gpu] = json.loads(out)["devices"]
    assert gpu["memory_protection"] == "guarded"


def test_describe_refuses_a_caps_mode_the_daemon_refuses(tmp_path: Path) -> None:
    """By hand, describe read any MEMORY_CAPS other than `off` as `auto`."""
    code, out = _describe(tmp_path, env={"MEMORY_CAPS": "sometimes"})
    assert code == 2
    assert "'sometimes' is not one of 'auto', 'off'" in out


def test_an_offline_command_reads_the_daemons_node_variable(tmp_path: Path) -> None:
    result = CliRunner(env={"GPUSLICE_NODE": "sim:3xt4"}).invoke(main, ["labels", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["nvidia.com/gpu.count"] == "3"


def test_no_command_but_the_daemon_reads_a_knobs_variable_by_hand() -> None:
    by_hand = {
        path.name: re.findall(r"os\.environ(?:\.get)?[\[(]\"([A-Z_]+)\"", path.read_text())
        for path in SRC.glob("*.py")
    }
    assert {name: found for name, found in by_hand.items() if found} == {}


def test_in_the_agents_pod_the_offline_commands_show_the_daemons_default_config(
    tmp_path: Path,
) -> None:
    """The chart gives the agent `CONFIG_FILE` (a directory of named configs) and
    `DEFAULT_CONFIG`; run in its pod, `labels` and `describe` read both, as the daemon does
    on a node without the label, instead of stopping at "several named configs"."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "plain").write_text("version: v1\n")
    (configs / "sliced").write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    env = {"GPUSLICE_NODE": "sim:2xt4", "CONFIG_FILE": str(configs), "DEFAULT_CONFIG": "sliced"}
    result = CliRunner(env=env).invoke(main, ["labels", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["nvidia.com/gpu.replicas"] == "4"
    result = CliRunner(env=env).invoke(main, ["describe", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["resources"] == {"nvidia.com/gpu": 8}  # 2 GPUs x 4
