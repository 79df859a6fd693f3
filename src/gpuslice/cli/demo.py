"""`gpuslice demo`: seed 000 on a simulated node, printed like `kubectl` would show it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from gpuslice.cli.common import console, plan_for
from gpuslice.cli.logsetup import setup_logging
from gpuslice.cli.main import EXIT_BAD_INPUT, reports_errors
from gpuslice.cli.output import emit, output_option, plain
from gpuslice.demo.scenario import DEFAULT_NODE, TIME_SLICING_CONFIG, DemoResult, Step, run_demo


def _node_table(step: Step) -> Table:
    table = Table(title="kubectl describe node (extended resources)", title_justify="left")
    table.add_column("resource")
    table.add_column("Capacity", justify="right")
    table.add_column("Allocatable", justify="right")
    table.add_column("Allocated", justify="right")
    for name in sorted(step.counts.capacity):
        table.add_row(
            name,
            str(step.counts.capacity[name]),
            str(step.counts.allocatable.get(name, 0)),
            str(step.counts.allocated.get(name, 0)),
        )
    if not step.counts.capacity:
        table.add_row("(none)", "0", "0", "0")
    return table


def _short(device_id: str) -> str:
    """`GPU-95d02075-8018-...::2` -> `GPU-95d02075…::2`: enough to tell GPUs apart."""
    base, sep, replica = device_id.partition("::")
    head = base[:12] + "…" if len(base) > 13 else base
    return head + sep + replica


def _pods_table(step: Step) -> Table:
    table = Table(title="kubectl get pods", title_justify="left")
    table.add_column("NAME", no_wrap=True)
    table.add_column("STATUS")
    table.add_column("device ID (kubelet)", no_wrap=True)
    table.add_column("NVIDIA_VISIBLE_DEVICES (container)", no_wrap=True)
    for pod in step.pods:
        env = dict(pod.env)
        style = "green" if pod.status == "Running" else "yellow"
        table.add_row(
            pod.name,
            f"[{style}]{pod.status}[/{style}]",
            ", ".join(_short(d) for d in pod.devices) or "-",
            ", ".join(_short(v) for v in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if v)
            or "-",
        )
    return table


def render(result: DemoResult, console: Console) -> None:
    console.print(
        Panel.fit(
            f"gpuslice demo: seed 000 (oversubscribing GPUs with time-slicing)\n"
            f"node: [bold]{result.node}[/bold] (simulated GPUs), "
            "kubelet: emulated over unix sockets",
        )
    )
    for i, step in enumerate(result.steps, 1):
        console.rule(f"[bold]{i}. {step.title}")
        if step.note:
            console.print(Panel(step.note.rstrip(), title="config", expand=False))
        console.print(_node_table(step))
        if step.pods:
            console.print(_pods_table(step))
            reasons = sorted({p.reason for p in step.pods if p.reason})
            for reason in reasons:
                console.print(f"[yellow]Pending:[/yellow] {reason}")
    console.print(summary(result))


def summary(result: DemoResult) -> str:
    """What the demo showed and the next thing to try, in a few lines."""
    first, last = result.steps[0], result.steps[-1]
    before = sum(first.counts.capacity.values())
    after = sum(last.counts.capacity.values())
    running = sum(1 for p in last.pods if p.status == "Running")
    return (
        "\n[bold]Summary[/bold]: the node advertised "
        f"{before} GPU(s); with the sharing config it advertises {after} devices and "
        f"{running} of {len(last.pods)} pods run.\n"
        "Replica IDs: the kubelet sees each replica as its own device, `<GPU UUID>::<n>`; "
        "the container gets only the GPU UUID (NVIDIA_VISIBLE_DEVICES), so pods holding "
        "replicas of one GPU share that GPU by time-slicing.\n"
        f"Next: gpuslice describe --node {result.node} --config-file <your config> "
        "(what a node would advertise), or deploy with docs/install.md."
    )


@click.command()
@click.option(
    "--node",
    default=DEFAULT_NODE,
    show_default=True,
    help="Simulated node spec, e.g. sim:2xt4 or sim:1xa100-80gb/mig=1g.10gb*7.",
)
@click.option(
    "--config-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Config applied in step 3 (default: time-slicing, replicas 4).",
)
@click.option("--pods", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Show the agent's logs.")
@click.option(
    "--scenario",
    type=click.Choice(["seed000", "guard"]),
    default="seed000",
    show_default=True,
    help="guard: seed 001, one time-sliced pod leaking memory, the memory guard off and on.",
)
@output_option
@reports_errors
def demo(
    node: str, config_file: Path | None, pods: int, verbose: bool, scenario: str, output: str
) -> None:
    """Replay seed 000 on an emulated node: 2 GPUs, 4 pods, then time-slicing x4.

    `--scenario guard` replays seed 001 instead (a leaking pod on a time-sliced L40S, the
    memory guard off and enforcing; --node and --pods do not apply).
    """
    if scenario == "guard":
        from gpuslice.cli.demo_guard import render_guard
        from gpuslice.demo.guard import run_guard_demo

        guard_result = run_guard_demo()
        if output == "table":
            render_guard(guard_result, console())
        else:
            emit(plain(guard_result), output)
        return
    setup_logging("text", verbose=False)
    if not verbose:
        import logging

        logging.getLogger().setLevel(logging.WARNING)
    plan_for(node, config_file)  # a bad config or node fails here, at once, by name
    text = config_file.read_text(encoding="utf-8") if config_file else TIME_SLICING_CONFIG
    try:
        result = asyncio.run(run_demo(node, text, pods))
    except TimeoutError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if output == "table":
        render(result, console())
    else:
        emit(plain(result), output)
