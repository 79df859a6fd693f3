"""`advise` in a terminal: the plan, its reasons, the replay, and each pod's memory over
time against the recommended share as one line of blocks (red: above the share)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpuslice.core.advise import Advice, History, ModelAdvice
from gpuslice.core.advise.replay import ReplayOutcome
from gpuslice.core.advise.stats import PodStats
from gpuslice.core.describe import gib

BLOCKS = "▁▂▃▄▅▆▇█"
CHART_WIDTH = 32


def sparkline(
    memory_mib: Sequence[int], first: int, points: int, share_mib: int, width: int = CHART_WIDTH
) -> Text:
    """The pod's memory on the history's whole time axis, `width` columns, each the largest
    value in its stretch of time; a full block is the share, red above it, blank where the
    pod did not exist."""
    out = Text()
    for col in range(width):
        lo = col * points // width
        hi = max(lo + 1, (col + 1) * points // width)
        values = memory_mib[max(0, lo - first) : max(0, hi - first)]
        if not values:
            out.append(" ")
            continue
        top = max(values)
        if share_mib > 0 and top > share_mib:
            out.append("█", style="bold red")
        else:
            level = 0 if share_mib <= 0 else math.ceil(top / share_mib * len(BLOCKS)) - 1
            out.append(BLOCKS[max(0, min(len(BLOCKS) - 1, level))], style="green")
    return out


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _verdict(p: PodStats) -> str:
    if p.idle:
        return "[yellow]idle[/yellow]"
    if p.leak is not None:
        return f"[red]leaker[/red] +{p.leak.rate_mib_per_h:.0f} MiB/h"
    return "sized"


def _plain(text: str) -> str:
    """Text that comes from labels (model and pod names, and the reasons quoting them),
    shown as it is: rich markup in a label is escaped (`[/bold]` was a traceback) and a
    control character is written as Python escapes it (`\\x1b`), never sent to the
    terminal. Newlines stay: the reasons are joined with them."""
    shown = "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)
    return escape(shown)


def _names(names: Sequence[str]) -> str:
    return _plain(", ".join(names)) if names else "none"


def _replay_rows(table: Table, label: str, r: ReplayOutcome | None) -> None:
    if r is None:
        return
    table.add_row(
        label,
        str(r.replicas),
        f"{r.gpus} (whole GPUs: {r.whole_gpus}, saved {r.gpus_saved})",
        _names(r.oom_without_guard),
        _names(r.stopped_by_guard),
        _names(r.oom_with_guard),
        _names(r.capped_with_caps),
        _names(r.oom_with_caps),
    )


def render_model(m: ModelAdvice, history: History, console: Console) -> None:
    current = "unknown" if m.current_replicas is None else str(m.current_replicas)
    console.print(
        f"[bold]{_plain(m.model)}[/bold] · {gib(m.memory_mib)} GiB · {m.gpus_seen} GPU(s) seen · "
        f"{len(m.pods)} pod(s) · current replicas {current} · config name {m.key}"
    )
    for note in m.notes:
        console.print(f"  [yellow]•[/yellow] {_plain(note)}")
    ts = m.time_slicing
    if ts is not None:
        plan = Table(title="recommendation", title_justify="left", show_lines=True)
        plan.add_column("strategy", no_wrap=True)
        plan.add_column("plan")
        plan.add_column("why")
        plan.add_row(
            "time-slicing",
            f"replicas {ts.replicas}\nshare {gib(ts.share_mib)} GiB",
            _plain("\n".join(ts.why)),
        )
        if m.mps is not None:
            plan.add_row(
                "MPS",
                f"replicas {m.mps.replicas}\nlimit {m.mps.pinned_limit_mib} MiB\n"
                f"{m.mps.active_thread_percentage}% threads",
                _plain("\n".join(m.mps.why)),
            )
        if m.caps is not None:
            plan.add_row(
                "memory caps (r615+)",
                f"soft {m.caps.soft_mib} MiB\nhard {m.caps.hard_mib} MiB\n{m.caps.policy}",
                _plain("\n".join(m.caps.why)),
            )
        if m.mig is not None:
            plan.add_row("MIG", "\n".join(m.mig.layouts), _plain("\n".join(m.mig.why)))
        plan.add_row("DRA", "per pod below", "memory = the pod's peak + headroom, as a share")
        console.print(plan)
    share = ts.share_mib if ts is not None else m.memory_mib
    pods = Table(
        title=f"pods ({_when(history.start)} → {_when(history.end)}; chart: █ = "
        f"{gib(share)} GiB share, red above)",
        title_justify="left",
    )
    for name in ("pod", "peak", "p99", "mean SM", "active", "verdict", "MIG", "DRA", "memory"):
        pods.add_column(name, no_wrap=name in ("pod", "memory"))
    fits = {(f.pod, f.container): f.profile for f in (m.mig.fits if m.mig else ())}
    dra = {(d.pod, d.container): d.quantity for d in m.dra}
    for p in m.pods:
        who = (p.name, p.trace.key.container)
        pods.add_row(
            _plain(p.name),
            f"{gib(p.peak_mib)} GiB",
            f"{gib(p.p99_mib)} GiB",
            "n/a" if p.mean_sm_percent is None else f"{p.mean_sm_percent:.0f}%",
            _hours(p.active_s),
            _verdict(p),
            fits.get(who) or "",
            dra.get(who, ""),
            sparkline(p.trace.memory_mib, p.trace.first, history.points, share),
        )
    console.print(pods)
    if m.replay_recommended is not None or m.replay_current is not None:
        replay = Table(
            title="replay (the simulator's memory model; the guard policy off, then enforcing; "
            "then the driver's caps, strict, the guard stepped back)",
            title_justify="left",
        )
        for name in ("size", "replicas", "GPUs", "OOM without guard", "stopped by guard"):
            replay.add_column(name)
        replay.add_column("OOM with guard")
        replay.add_column("failed at own cap")
        replay.add_column("OOM with caps")
        _replay_rows(replay, "recommended", m.replay_recommended)
        _replay_rows(replay, "current", m.replay_current)
        console.print(replay)


def render_advice(advice: Advice, history: History, console: Console) -> None:
    console.print(
        f"[bold]gpuslice advise[/bold] · {_when(advice.start)} → {_when(advice.end)} · "
        f"step {advice.step_s:g} s · headroom {advice.headroom_percent:g}%"
    )
    for m in advice.models:
        console.print()
        render_model(m, history, console)
