"""`gpuslice labels`: the node labels GPU Feature Discovery would write, for a config."""

from __future__ import annotations

import time
from pathlib import Path

import click

from gpuslice.agent.settings import AgentSettings
from gpuslice.cli.common import daemon_option, plan_for
from gpuslice.cli.errors import reports_errors
from gpuslice.cli.output import emit, output_option
from gpuslice.core.labels import gfd_labels


@click.command()
@daemon_option(AgentSettings, "config_path")
@daemon_option(AgentSettings, "config_name")
@daemon_option(AgentSettings, "default_config")
@daemon_option(AgentSettings, "node")
@daemon_option(AgentSettings, "no_timestamp")
@output_option
@reports_errors
def labels(
    config_path: Path | None,
    config_name: str,
    default_config: str,
    node: str,
    no_timestamp: bool,
    output: str,
) -> None:
    """Print node labels: `key=value` lines as in the NFD features.d file (`-o table`, the
    default), or one JSON/YAML mapping."""
    view = plan_for(node, config_path, config_name, default_config=default_config)
    stamp = None if no_timestamp or view.config.flags.gfd.no_timestamp else int(time.time())
    values = gfd_labels(
        view.inventory, view.plan, timestamp=stamp, machine_type=view.inventory.machine_type
    )
    if output != "table":
        emit({key: values[key] for key in sorted(values)}, output)
        return
    for key in sorted(values):
        click.echo(f"{key}={values[key]}")
