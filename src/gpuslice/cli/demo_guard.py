"""`gpuslice demo --scenario guard`: ten time-sliced pods on an L40S, one leaking, with the
memory guard off, then enforcing, then with the driver's memory caps."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from gpuslice.demo.guard import LEAK_MIB_S, LEAKER, STRESS_MIB, GuardDemo
from gpuslice.demo.guardsim import SimResult

_WHAT = {
    "oom": "[red]CUDA error: out of memory[/red] (asked {used} MiB, {free} MiB free)",
    "capped": "[bold]its own allocation failed at its hard limit[/bold] (asked {used} MiB, "
    "{free} MiB still free for the others)",
    "over-share": "[yellow]over its share[/yellow], borrowing ({used} MiB, {free} MiB free)",
    "reclaim": "[bold]stopped by the guard[/bold] (SIGTERM; {used} MiB, {free} MiB free)",
    "exited": "exited, memory back: {free} MiB free",
}


def _timeline(result: SimResult) -> Table:
    table = Table(show_header=True, header_style="bold")
    table.add_column("t (s)", justify="right")
    table.add_column("pod")
    table.add_column("what happened")
    for e in result.events:
        if e.what in _WHAT:
            text = _WHAT[e.what].format(used=e.used_mib, free=e.free_mib)
            table.add_row(f"{e.at:.1f}", e.pod, text)
    return table


def _fates(demo: GuardDemo, result: SimResult) -> str:
    running = [p.name for p in demo.pods if result.fates.get(p.name) == "running"]
    gone = [f"{n} ({f})" for n, f in result.fates.items() if f != "running"]
    return f"running: {len(running)} pods; gone: {', '.join(gone) or 'none'}"


def render_guard(demo: GuardDemo, console: Console) -> None:
    p = demo.params
    console.print(
        Panel.fit(
            "gpuslice demo --scenario guard: time-slicing has no memory isolation\n"
            f"node: [bold]sim:1xl40s[/bold] ({demo.gpu}, {demo.total_mib} MiB), "
            f"time-slicing x{len(demo.pods)}: share {demo.share_mib} MiB per pod\n"
            f"pods hold {STRESS_MIB} MiB each (a stress test's 3.7 GiB); "
            f"{LEAKER} leaks {LEAK_MIB_S:g} MiB/s; the last pod starts at t=50 s",
        )
    )
    console.rule("[bold]1. memory guard off (NVIDIA's behaviour)")
    console.print(_timeline(demo.off))
    console.print(_fates(demo, demo.off))
    console.rule(
        f"[bold]2. memory guard enforce (reserve {p.reserve}, grace {p.grace_s:g} s, "
        f"poll {demo.interval_s:g} s)"
    )
    console.print(_timeline(demo.enforce))
    console.print(_fates(demo, demo.enforce))
    console.rule(
        f"[bold]3. memory caps (driver r615+: soft = hard = {demo.share_mib} MiB per pod, "
        "the guard stepped back)"
    )
    console.print(_timeline(demo.caps))
    console.print(_fates(demo, demo.caps))
