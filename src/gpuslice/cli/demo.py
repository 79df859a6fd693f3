"""`gpuslice demo`: pods sharing a simulated node's GPUs, printed as `kubectl` shows them,
then one of them leaking memory, NVIDIA's outcome beside gpuslice's."""

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

from gpuslice.agent.settings import AgentSettings, CapsSettings, GuardSettings
from gpuslice.cli.common import NodeView, console, plan_for
from gpuslice.cli.describe import _protection, _render_table, claims_table, short_ids, slices_table
from gpuslice.cli.errors import EXIT_BAD_INPUT, reports_errors
from gpuslice.cli.logsetup import setup_logging
from gpuslice.cli.output import emit, output_option, plain
from gpuslice.core.describe import describe as describe_plan
from gpuslice.demo.dra_scenario import DRA_NODE, DemoError, DraDemoResult, DraStep, run_dra_demo
from gpuslice.demo.guardsim import SimEvent, SimResult
from gpuslice.demo.leak import LeakStory
from gpuslice.demo.scenario import DEFAULT_NODE, TIME_SLICING_CONFIG, DemoResult, Step, run_demo
from gpuslice.host.configfiles import read_configs


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


def render(result: DemoResult, console: Console, describe: NodeView | None = None) -> None:
    gpus = ""
    if describe is not None:
        names = [g.product_name for g in describe.inventory.gpus]
        gpus = " (" + ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names)) + ")"
    console.print(
        Panel.fit(
            "gpuslice demo: pods sharing GPUs, and one pod taking more than its share\n"
            f"node: [bold]{result.node}[/bold]{gpus}, simulated; the gpuslice agent, "
            "a kubelet emulated over unix sockets",
        )
    )
    for i, step in enumerate(result.steps, 1):
        console.rule(f"[bold]{i}. {step.title}")
        if step.note:
            console.print(Panel(step.note.rstrip(), title="config", expand=False))
        console.print(_node_table(step))
        if step.pods:
            console.print(_pods_table(step))
            for pod in step.pods:
                if pod.reason:
                    console.print(
                        f"[yellow]{pod.name}[/yellow]: {pod.reason} "
                        "[dim](kubectl describe pod: Warning FailedScheduling)[/dim]"
                        if pod.status == "Pending"
                        else f"[red]{pod.name}[/red]: {pod.reason}"
                    )
        if step.note and describe is not None:
            console.print(
                f"[dim]$ gpuslice describe --node {result.node} --config-file <this config>[/dim]"
            )
            protection = _demo_protection(result.node, describe)
            _render_table(
                describe, describe_plan(describe.plan, describe.inventory, protection), console
            )
    if result.memory is not None:
        render_leak(result.memory, console, len(result.steps) + 1)
    elif result.memory_note:
        console.print(f"[dim]{result.memory_note}[/dim]")
    console.print(summary(result))


def _demo_protection(node: str, view: NodeView) -> dict[str, tuple[str, str]]:
    from gpuslice.backends import open_backend

    backend = open_backend(node)
    try:
        # what `gpuslice describe` shows with the daemon's defaults, as the demo prints it
        caps, guard = CapsSettings().mode, GuardSettings().mode
        return _protection(backend, view.inventory, AgentSettings().cgroup_root, caps, guard)
    finally:
        backend.close()


def _event_text(story: LeakStory, e: SimEvent) -> str:
    if e.what == "oom":
        who = "within its share" if e.pod == story.neighbour else "over its share"
        return f"[red]{e.pod}: CUDA error: out of memory[/red] at its next batch ({who})"
    if e.what == "capped":
        return (
            f"[bold]{e.pod}: its own allocation fails at its cap[/bold] "
            f"({story.share_mib} MiB; {e.free_mib} MiB still free for the others)"
        )
    if e.what == "over-share":
        return f"[yellow]{e.pod} over its share[/yellow] ({e.used_mib} MiB): borrowing, memory free"
    if e.what == "reclaim":
        return (
            f"[bold]{e.pod} stopped by the guard[/bold] (SIGTERM at {e.used_mib} MiB, "
            f"{e.free_mib} MiB free)"
        )
    if e.what == "exited":
        return f"{e.pod} exited: {e.free_mib} MiB free"
    return ""


def _outcome(story: LeakStory, run: SimResult) -> str:
    words = {"oom": "[red]died (OOM)[/red]", "capped": "failed at its cap", "reclaimed": "stopped"}
    parts = [
        f"{p.name} {words.get(run.fates.get(p.name, 'running'), '[green]runs[/green]')}"
        for p in story.pods
    ]
    return ", ".join(parts)


def render_leak(story: LeakStory, console: Console, number: int) -> None:
    console.rule(
        f"[bold]{number}. {story.leaker} leaks {story.leak_mib_s:g} MiB/s on GPU 0: "
        "NVIDIA's device plugin beside gpuslice"
    )
    console.print(
        f"{story.gpu} ({story.total_mib} MiB), time-slicing x{story.replicas}: each pod's share "
        f"is {story.share_mib} MiB. {story.neighbour} stays within it (a larger batch every "
        f"12 s); {story.leaker} keeps growing. [dim]Memory and time simulated; the guard's "
        "decisions are its real policy.[/dim]"
    )
    runs = (story.nvidia, story.guard, story.caps)
    told = [[(e.at, text) for e in r.events if (text := _event_text(story, e))] for r in runs]
    times = sorted({at for lines in told for at, _ in lines})
    table = Table(show_header=True, header_style="bold", show_lines=False)
    table.add_column("t (s)", justify="right")
    table.add_column("NVIDIA's device plugin\n(nothing between the pods)")
    table.add_column("gpuslice: memory guard\n(drivers before r615)")
    table.add_column("gpuslice: memory caps\n(driver r615+)")
    for t in times:
        cells = ["\n".join(text for at, text in lines if at == t) for lines in told]
        table.add_row(f"{t:.1f}", *cells)
    table.add_row("[bold]end[/bold]", *(_outcome(story, r) for r in runs), end_section=True)
    console.print(table)
    console.rule(
        f"[bold]{number + 1}. per-pod metrics at t={story.seen_at_s:g} s, as `gpuslice top` "
        "and /metrics show them"
    )
    top = Table(show_header=True, header_style="bold")
    for col in ("POD", "GPU", "MEMORY", "SHARE", ""):
        top.add_column(col, justify="right" if col in ("MEMORY", "SHARE") else "left")
    for row in story.top:
        top.add_row(
            f"default/{row.pod}",
            f"0 {_short(story.uuid)}",
            f"{row.used_mib} MiB",
            f"{row.share_mib} MiB",
            "[red]OVER[/red]" if row.over_share else "",
        )
    console.print(top)
    for row in story.top:
        console.print(
            f'[dim]gpuslice_pod_memory_over_share{{namespace="default",pod="{row.pod}",'
            f'gpu="0"}} {int(row.over_share)}[/dim]'
        )
    console.print(
        f"The guard's Warning Events name the pod (GPUMemoryOverShare, then GPUMemoryReclaimed "
        f"for default/{story.leaker}): [dim]kubectl events -n gpuslice --for pod/<agent pod>[/dim]"
    )


def summary(result: DemoResult) -> str:
    """What the demo showed and the next thing to try, in a few lines."""
    first, last = result.steps[0], result.steps[-1]
    before = sum(first.counts.capacity.values())
    after = sum(last.counts.capacity.values())
    running = sum(1 for p in last.pods if p.status == "Running")
    text = (
        "\n[bold]Summary[/bold]: the node advertised "
        f"{before} GPU(s); with the sharing config (NVIDIA's format) it advertises {after} "
        f"devices and {running} of {len(last.pods)} pods run (as with NVIDIA's device plugin)."
    )
    story = result.memory
    if story is not None:
        text += (
            f"\nWhen {story.leaker} outgrew its share, NVIDIA's device plugin let it take "
            f"{story.neighbour}'s memory: {story.neighbour}, within its share, died of CUDA "
            f"out-of-memory. gpuslice stopped {story.leaker} (memory guard) or held it to its "
            f"share (driver caps), and {story.neighbour} kept running; `gpuslice top` and "
            "/metrics named the pod over its share."
        )
    return text + (
        "\nNext: gpuslice describe --node "
        f"{result.node} --config-file <your config> (what a node would advertise); "
        "gpuslice demo --scenario guard (ten pods on an L40S); gpuslice demo --dra; "
        "a cluster: docs/install.md."
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
    help="Config applied in step 3, or a ConfigMap / Helm values of named configs with "
    "--config-name (default: time-slicing, replicas 4).",
)
@click.option(
    "--config-name",
    default="",
    help="The named config to apply from --config-file (NVIDIA's multi-config maps).",
)
@click.option("--pods", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Show the agent's logs.")
@click.option(
    "--scenario",
    type=click.Choice(["sharing", "guard", "dynamic-mig"]),
    default="sharing",
    show_default=True,
    help="sharing: pods that do not fit, NVIDIA's time-slicing config applied live, then one "
    "pod leaking memory (NVIDIA's outcome beside the memory guard's and the driver caps'). "
    "guard: ten time-sliced pods on an L40S, one leaking, guard off, on, and caps. "
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
    config_name: str,
    pods: int,
    verbose: bool,
    scenario: str,
    dra: bool,
    output: str,
) -> None:
    """Pods sharing a simulated node's GPUs, and one pod taking more than its share.

    On 2 GPUs, 4 pods asking for one each: two wait (Insufficient nvidia.com/gpu); NVIDIA's
    time-slicing config, applied live, lets all four run; then one pod on a shared GPU
    leaks memory: with NVIDIA's device plugin its neighbour dies of out-of-memory, with
    gpuslice the leaker is stopped (memory guard) or held to its share (driver caps), and
    `gpuslice top` names it. `--scenario guard` tells the memory part with ten pods;
    `--dra` shows DRA mode.
    """
    if config_name and config_file is None:
        raise click.UsageError("--config-name names a config in --config-file")
    if dra:
        if config_file is not None or scenario != "sharing":
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
    view = plan_for(node, config_file, config_name)  # a bad config or node fails here, at once
    text = TIME_SLICING_CONFIG if config_file is None else _config_text(config_file, view)
    if config_file is not None:
        _refuse_a_config_that_changes_nothing(node, config_file, view)
    try:
        result = asyncio.run(run_demo(node, text, pods))
    except TimeoutError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if output == "table":
        render(result, console(), view if config_file is not None else _default_view(node))
    else:
        emit(plain(result), output)


def _default_view(node: str) -> NodeView:
    """describe's view of the demo's own config, read as describe reads a file."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gsdemo-") as tmp:
        path = Path(tmp) / "time-slicing.yaml"
        path.write_text(TIME_SLICING_CONFIG, encoding="utf-8")
        return plan_for(node, path)


def _config_text(path: Path, view: NodeView) -> str:
    """The one config the demo's agent is given: the named one from a set of configs."""
    named = read_configs(path)
    if named.single_file:
        return next(iter(named.texts.values()))
    return named.texts.get(view.config_name, "")


def _counts(view: NodeView) -> dict[str, int]:
    return {r.name: len(r.devices) for r in view.plan.resources}


def _refuse_a_config_that_changes_nothing(node: str, path: Path, view: NodeView) -> None:
    """The demo waits for the node to advertise something new; a config that shares
    nothing would leave it waiting for a timeout, so say so before starting."""
    without = _counts(plan_for(node, None))
    advertised = _counts(view)
    if advertised != without:
        return
    which = f"{path}" + (f" (config {view.config_name})" if view.config_name else "")
    shown = ", ".join(f"{n}: {c}" for n, c in sorted(advertised.items())) or "nothing"
    click.echo(
        f"error: {which} shares nothing on {node}: it advertises what the node advertises "
        f"without a config ({shown}); the demo applies a config that shares GPUs "
        "(sharing.timeSlicing or sharing.mps replicas, or a MIG strategy on a MIG node)",
        err=True,
    )
    sys.exit(EXIT_BAD_INPUT)


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
