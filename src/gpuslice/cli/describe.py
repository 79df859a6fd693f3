"""`gpuslice describe`: what a config does on a node, before it is applied."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gpuslice.cli.common import NodeView, console, plan_for
from gpuslice.cli.main import reports_errors
from gpuslice.cli.output import emit, output_option
from gpuslice.core.describe import DescribeReport, gib, report_to_dict
from gpuslice.core.describe import describe as describe_plan


def _render_table(view: NodeView, report: DescribeReport, console: Console) -> None:
    title = f"node {view.backend_name} · driver {report.driver_version}"
    title += f" · MIG strategy {report.mig_strategy}"
    if view.config_name:
        title += f" · config {view.config_name}"
    console.print(f"[bold]{title}[/bold]")
    res = Table()
    res.add_column("resource")
    res.add_column("advertised", justify="right")
    for name, count in report.resources:
        res.add_row(name, str(count))
    if not report.resources:
        res.add_row("(nothing advertised)", "0")
    console.print(res)

    gpus = Table(title="physical GPUs and what each advertised device gets", title_justify="left")
    gpus.add_column("GPU", justify="right")
    gpus.add_column("product / device")
    gpus.add_column("memory", justify="right")
    gpus.add_column("SMs", justify="right")
    gpus.add_column("resource")
    gpus.add_column("replicas", justify="right")
    gpus.add_column("per replica")
    for g in report.devices:
        gpus.add_row(
            str(g.index),
            f"{g.product}\n[dim]{g.uuid}[/dim]",
            f"{gib(g.memory_mib)} GiB",
            str(g.multiprocessors),
            "",
            "",
            "MIG enabled" if g.mig_enabled else "",
        )
        for m in g.mig_devices:
            shares = [s for s in g.shares if s.device_uuid == m.uuid]
            resource = ", ".join(s.resource for s in shares) or "[dim]not advertised[/dim]"
            replicas = ", ".join(str(s.replicas) for s in shares)
            words = "; ".join(s.share for s in shares)
            gpus.add_row(
                m.index_id,
                f"  MIG {m.profile}",
                f"{gib(m.memory_mib)} GiB",
                str(m.multiprocessors),
                resource,
                replicas,
                words,
            )
        for s in g.shares:
            if s.device_uuid == g.uuid:
                gpus.add_row("", "", "", "", s.resource, str(s.replicas), s.share)
    console.print(gpus)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")


@click.command("describe")
@click.option(
    "--config-file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Config file, or a directory/ConfigMap/Helm values holding named configs.",
)
@click.option("--config-name", default="", help="Named config to use from a set of configs.")
@click.option(
    "--node",
    default="nvml",
    show_default=True,
    help="nvml (this machine's GPUs) or a simulated node spec such as sim:2xt4.",
)
@output_option
@reports_errors
def describe_command(config_file: Path | None, config_name: str, node: str, output: str) -> None:
    """Show what this node would advertise with a config, and what each replica gets."""
    view = plan_for(node, config_file, config_name)
    report = describe_plan(view.plan, view.inventory)
    if output == "table":
        _render_table(view, report, console())
    else:
        emit(report_to_dict(report), output)
