"""`gpuslice top`: the snapshot as tables, like nvidia-smi but per pod and with entitlements.

Returns rich renderables (no printing) so the CLI decides between one shot and a live view,
and tests render to a string.
"""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuslice.core.attribution import ContainerGpuUsage
from gpuslice.metrics.snapshot import MetricsSnapshot

MIB = 1024 * 1024


def _mib(n_bytes: int) -> str:
    return f"{n_bytes // MIB} MiB"


def _opt(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _share(u: ContainerGpuUsage) -> Text:
    """Memory used as a percentage of the entitlement, red above 100 %."""
    ent = u.entitlement.memory_bytes
    if ent <= 0:
        return Text("-")
    pct = 100.0 * u.memory_used_bytes / ent
    return Text(f"{pct:.0f}%", style="bold red" if pct > 100.0 else "")


def render_top(snapshot: MetricsSnapshot | None, *, now: float | None = None) -> RenderableType:
    if snapshot is None:
        return Text("no metrics snapshot yet")
    age = (time.time() if now is None else now) - snapshot.taken_at
    header = Text(f"{snapshot.hostname}  snapshot {age:.0f}s old")

    gpus = Table(title="GPUs", title_justify="left")
    for col in ("GPU", "UUID", "MODEL", "MEMORY", "UTIL", "TEMP", "POWER", "LAST XID"):
        gpus.add_column(col)
    for g in snapshot.gpus:
        s = g.status
        gpus.add_row(
            "?" if g.index is None else str(g.index),
            g.uuid,
            g.model,
            f"{s.memory_used_mib} / {g.memory_total_mib} MiB",
            _opt(s.gpu_util_percent, "d") + ("%" if s.gpu_util_percent is not None else ""),
            _opt(s.temperature_c, "d") + ("C" if s.temperature_c is not None else ""),
            _opt(s.power_w, ".0f") + ("W" if s.power_w is not None else ""),
            str(s.last_xid) if s.last_xid else "-",
        )

    pods = Table(title="Pods", title_justify="left")
    for col in ("GPU", "NAMESPACE/POD", "CONTAINER", "SHARING", "MEMORY USED", "ENTITLED"):
        pods.add_column(col)
    for col in ("OF SHARE", "SM %", "SM SHARE", "PIDS"):
        pods.add_column(col)
    for u in sorted(snapshot.attribution.usages, key=lambda u: (u.gpu_index, u.namespace, u.pod)):
        ent = u.entitlement
        pods.add_row(
            str(u.gpu_index),
            f"{u.namespace}/{u.pod}",
            u.container,
            ent.kind,
            _mib(u.memory_used_bytes),
            _mib(ent.memory_bytes),
            _share(u),
            _opt(u.sm_util_percent, ".0f"),
            "-" if ent.sm_fraction is None else f"{100 * ent.sm_fraction:.0f}%",
            ",".join(str(p) for p in u.pids) or "-",
        )

    parts: list[RenderableType] = [header, gpus, pods]
    others = snapshot.attribution.unattributed
    if others:
        lines = [f"pid {p.pid} on {p.gpu_uuid}: {p.reason}" for p in others]
        parts.append(Text("Not attributed to a container:\n  " + "\n  ".join(lines)))
    for problem in snapshot.problems:
        parts.append(Text(f"warning: {problem}", style="yellow"))
    return Group(*parts)
