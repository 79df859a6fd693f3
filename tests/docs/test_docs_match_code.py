"""The docs' tables of flags, environment variables and chart values against the code, so
the docs cannot say things the code does not do (issue 15: three documented variables were
never read)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import yaml

from gpuslice.agent.knobs import knobs
from gpuslice.cli.main import main
from gpuslice.cli.plugin import GROUPS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE = re.compile(r"`([^`]+)`")


def table_rows(doc: Path, heading: str) -> list[list[str]]:
    """The cells of the first table after `heading`, header and separator dropped."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and heading in line)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def plugin_options() -> dict[str, click.Option]:
    command = main.get_command(click.Context(main), "plugin")  # subcommands load lazily
    assert command is not None
    return {
        opt: p
        for p in command.params
        if isinstance(p, click.Option)
        for opt in (*p.opts, *p.secondary_opts)
    }


def env_read_directly() -> set[str]:
    """Variables read without a click option: the settings' env-only knobs (the plugin
    command reads them in one place), and any `os.environ.get("NAME")` left in the CLI."""
    found = {
        f.knob.env
        for group in GROUPS
        for f in knobs(group)
        if not f.knob.flags and f.knob.env is not None
    }
    for path in (ROOT / "src/gpuslice/cli").glob("*.py"):
        found |= set(re.findall(r'os\.environ\.get\("([A-Z_]+)"\)', path.read_text()))
    return found


def test_every_documented_flag_exists_with_its_environment_variable() -> None:
    options = plugin_options()
    rows = table_rows(DOCS / "configuration.md", "`gpuslice plugin` flags")
    assert len(rows) > 30
    for flags, env, *_ in rows:
        names = CODE.findall(flags)
        envs = CODE.findall(env)
        for name in names:
            assert name in options, f"documented flag {name} does not exist"
            if envs:
                assert options[name].envvar == envs[0], (name, options[name].envvar, envs)
            else:
                assert not options[name].envvar, f"{name} reads {options[name].envvar}"
        if not names:
            assert set(envs) <= env_read_directly(), f"{envs} are not read"


def test_every_flag_of_the_plugin_is_documented() -> None:
    rows = table_rows(DOCS / "configuration.md", "`gpuslice plugin` flags")
    documented = {name for flags, *_ in rows for name in CODE.findall(flags)}
    missing = set(plugin_options()) - documented - {"--help", "-h"}
    assert not missing, f"undocumented flags of gpuslice plugin: {sorted(missing)}"


def test_every_environment_variable_in_the_config_reference_is_read() -> None:
    """The config-file table's env column: each variable must be read by the plugin."""
    read = {p.envvar for p in plugin_options().values() if p.envvar} | env_read_directly()
    rows = table_rows(DOCS / "configuration.md", "## `flags`")
    envs = [e for row in rows if len(row) > 2 for e in CODE.findall(row[2])]
    assert envs, "the table was not found"
    for env in envs:
        if env.endswith("..."):
            continue
        assert env in read, f"docs/configuration.md names {env}, which the plugin does not read"


def _has_value(values: Any, dotted: str) -> bool:
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_documented_chart_value_exists() -> None:
    values = yaml.safe_load((ROOT / "deploy/helm/gpuslice/values.yaml").read_text())
    rows = table_rows(DOCS / "install.md", "## Values")
    assert len(rows) > 10
    for value, *_ in rows:
        for name in CODE.findall(value):
            assert _has_value(values, name), f"docs/install.md documents {name}: not a value"


def test_every_nvidia_value_the_chart_refuses_is_in_the_migration_guide() -> None:
    template = (ROOT / "deploy/helm/gpuslice/templates/_nvidia.tpl").read_text()
    refused = re.findall(r'hasKey \.Values "([^"]+)"', template)
    assert "compatWithCPUManager" in refused
    guide = (DOCS / "migrating-from-nvidia.md").read_text()
    missing = [key for key in refused if f"`{key}" not in guide]
    assert not missing, f"refused by the chart but not in the migration guide: {missing}"
