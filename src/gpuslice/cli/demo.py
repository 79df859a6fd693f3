"""`gpuslice demo`: seed 000 on a simulated node, printed like `kubectl` would show it."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from gpuslice.cli.common import console, plan_for
from gpuslice.cli.describe import claims_table, short_ids, slices_table
from gpuslice.cli.errors import EXIT_BAD_INPUT, reports_errors
from gpuslice.cli.logsetup import setup_logging
from gpuslice.cli.output import emit, output_option, plain
from gpuslice.demo.dra_scenario import DRA_NODE, DemoError, DraDemoResult, DraStep, run_dra_demo
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


def _dra_pods_table(step: DraStep) -> Table:
    table = Table(title="pods: what the container runtime gets (CDI spec)", title_justify="left")
    table.add_column("pod", no_wrap=True)
    table.add_column("CDI device ID (from NodePrepareResources)", no_wrap=True)
    table.add_column("container env and mounts", overflow="fold")
    for pod in step.pods:
        env = [f"{k}={short_ids(v)}" for k, v in pod.env]
        env += [
            f"[dim]mount {m.container_path} ← {short_ids(m.host_path)}[/dim]" for m in pod.mounts
        ]
        how = "" if pod.prepared else "\n[dim](claim already prepared:\n kubelet reused it)[/dim]"
        table.add_row(
            f"{pod.name}\n[dim]{pod.claim}[/dim]{how}",
            "\n".join(short_ids(i) for i in pod.cdi_ids),
            "\n".join(env),
        )
    return table


def _dra_claims_table(step: DraStep) -> Table:
    table = Table(title="kubectl get resourceclaims", title_justify="left")
    table.add_column("claim", no_wrap=True)
    table.add_column("allocated (request → device)", no_wrap=True)
    table.add_column("reserved for")
    table.add_column("config")
    for c in step.claims:
        table.add_row(
            f"{c.namespace}/{c.name}",
            "\n".join(f"{r} → {d}" for r, d in c.devices) or "-",
            ", ".join(c.reserved_for) or "-",
            c.config or "-",
        )
    return table


def render_dra(
    result: DraDemoResult,
    console: Console,
    summary: Callable[[DraDemoResult], str] | None = None,
    what: str = "gpuslice demo --dra: the agent as a DRA driver (ResourceSlices, Prepare, CDI)",
) -> None:
    console.print(
        Panel.fit(
            f"{what}\n"
            f"node: [bold]{result.node}[/bold] (simulated GPUs) as {result.node_name}, driver "
            f"{result.driver}; kubelet emulated over unix sockets, scheduler played by the "
            "allocator, MPS by a fake control program",
        )
    )
    for i, step in enumerate(result.steps, 1):
        console.rule(f"[bold]{i}. {step.title}")
        if step.devices:
            console.print(slices_table(step.devices, "kubectl get resourceslices (devices)"))
        if step.note and step.what_if is None:
            console.print(Panel(step.note.rstrip(), title="claim", expand=False))
        if step.claims:
            console.print(_dra_claims_table(step))
        if step.pods:
            console.print(_dra_pods_table(step))
        for d in step.mps_daemons:
            limits = ", ".join(f"GPU {i}: {v}" for i, v in d.pinned_limits) or "none"
            state = "[green]answering[/green]" if d.ready else "[yellow]not answering[/yellow]"
            console.print(
                f"MPS control daemon {short_ids(d.key)} on GPU "
                f"{', '.join(map(str, d.gpu_indices))}: {state}; default active thread "
                f"percentage {d.active_thread_percentage or '?'}, pinned memory limit {limits}"
            )
        if step.what_if is not None:
            console.print(f"[dim]{step.note}[/dim]")
            console.print(claims_table(step.what_if.claims, "what each claim would get"))
        if i > 1 and not step.what_if:
            specs = ", ".join(short_ids(s) for s in step.cdi_specs) or "(none)"
            console.print(f"CDI specs on the node: {specs}")
    console.print((summary or dra_summary)(result))


def dynamic_mig_summary(result: DraDemoResult) -> str:
    devices = result.steps[0].devices
    mig = sum(1 for d in devices if d.type == "mig")
    return (
        f"\n[bold]Summary[/bold]: the GPU published {mig} MIG partitions and itself, over "
        "one counter set; claims asked for profiles, the scheduler chose the placements, "
        "Prepare created each MIG device and Unprepare destroyed it; a claim that did not "
        "fit was told which counter was used up.\n"
        f"Next: gpuslice describe --node '{result.node}' --config-file <config with "
        "flags.dynamicMig> --claims <claims.yaml>; docs/dra.md (dynamic MIG)."
    )


def dra_summary(result: DraDemoResult) -> str:
    devices = result.steps[0].devices
    mig = sum(1 for d in devices if d.type == "mig")
    return (
        f"\n[bold]Summary[/bold]: the node published {len(devices)} devices "
        f"({len(devices) - mig} whole GPU, {mig} MIG); two pods shared one MPS claim through "
        "one CDI device, a third got a MIG device picked by CEL, and unpreparing removed "
        "the CDI specs and stopped the MPS daemon.\n"
        f"Next: gpuslice describe --node '{result.node}' --claims <your claims.yaml> "
        "(what claims would get before you create them); docs/dra.md for a cluster."
    )


@click.command()
@click.option(
    "--node",
    default=None,
    help=f"Simulated node spec, e.g. sim:2xt4 or sim:1xa100-80gb/mig=1g.10gb*7 "
    f"[default: {DEFAULT_NODE}; {DRA_NODE} with --dra].",
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
    type=click.Choice(["seed000", "guard", "dynamic-mig"]),
    default="seed000",
    show_default=True,
    help="guard: seed 001, one time-sliced pod leaking memory, the memory guard off and on. "
    "dynamic-mig: DRA mode on an H100 in dynamic MIG, claims by profile (--node applies).",
)
@click.option(
    "--dra",
    is_flag=True,
    help="Run the agent as a DRA driver instead: ResourceSlices, an MPS claim shared by two "
    "pods, a MIG device by CEL, the what-if view, unprepare (--node applies).",
)
@output_option
@reports_errors
def demo(
    node: str | None,
    config_file: Path | None,
    pods: int,
    verbose: bool,
    scenario: str,
    dra: bool,
    output: str,
) -> None:
    """Replay seed 000 on an emulated node: 2 GPUs, 4 pods, then time-slicing x4.

    `--scenario guard` replays seed 001 instead (a leaking pod on a time-sliced L40S, the
    memory guard off and enforcing; --node and --pods do not apply). `--dra` shows DRA
    mode on an H100 node with one GPU whole and one in MIG.
    """
    if dra:
        if config_file is not None or scenario != "seed000":
            raise click.UsageError(
                "--dra runs its own scenario: --config-file and --scenario do not apply"
            )
        _run_dra(node or DRA_NODE, verbose, output)
        return
    if scenario == "dynamic-mig":
        if config_file is not None:
            raise click.UsageError("--scenario dynamic-mig runs its own config: --config-file")
        _run_dynamic_mig(node, verbose, output)
        return
    node = node or DEFAULT_NODE
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


def _run_dynamic_mig(node: str | None, verbose: bool, output: str) -> None:
    from gpuslice.demo.dynmig_scene import DYNAMIC_NODE, run_dynamic_mig_demo

    setup_logging("text", verbose=False)
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)
    node = node or DYNAMIC_NODE
    plan_for(node, None)  # a bad node spec fails here, at once, by name
    try:
        result = asyncio.run(run_dynamic_mig_demo(node))
    except (TimeoutError, DemoError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if output == "table":
        render_dra(
            result,
            console(),
            dynamic_mig_summary,
            "gpuslice demo --scenario dynamic-mig: MIG devices made per claim (DRA)",
        )
    else:
        emit(plain(result), output)


def _run_dra(node: str, verbose: bool, output: str) -> None:
    setup_logging("text", verbose=False)
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)
    plan_for(node, None)  # a bad node spec fails here, at once, by name
    try:
        result = asyncio.run(run_dra_demo(node))
    except (TimeoutError, DemoError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if output == "table":
        render_dra(result, console())
    else:
        emit(plain(result), output)
