"""`gpuslice top`: the snapshot as tables, like nvidia-smi but per pod and with entitlements.

Returns rich renderables (no printing) so the CLI decides between one shot and a live view,
and tests render to a string.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuslice.core.attribution import ContainerGpuUsage
from gpuslice.core.units import MIB
from gpuslice.metrics.collector import claim_of
from gpuslice.metrics.snapshot import MetricsSnapshot


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
            (
                f"{s.memory_used_mib} / {g.memory_total_mib} MiB"
                if s.memory_used_mib is not None
                else "n/a (unified memory)"
            ),
            _opt(s.gpu_util_percent, "d") + ("%" if s.gpu_util_percent is not None else ""),
            _opt(s.temperature_c, "d") + ("C" if s.temperature_c is not None else ""),
            _opt(s.power_w, ".0f") + ("W" if s.power_w is not None else ""),
            str(s.last_xid) if s.last_xid else "-",
        )

    usages = snapshot.attribution.usages
    claims = any(claim_of(u.resources) for u in usages)
    pods = _pods_table(claims)
    for u in sorted(usages, key=lambda u: (u.gpu_index, u.namespace, u.pod)):
        ent = u.entitlement
        pods.add_row(
            str(u.gpu_index),
            f"{u.namespace}/{u.pod}",
            u.container,
            *([claim_of(u.resources) or "-"] if claims else []),
            ent.kind.entitlement_kind,
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


def _pods_table(claims: bool, caps: bool = False) -> Table:
    """The pods table; a CLAIM column (DRA mode: the ResourceClaim behind the devices) only
    when some holder is a claim, so the device-plugin mode's table is as it was; the limits
    read back (SOFT, HARD) and whether they hold (CAPS) when the daemon reports caps."""
    pods = Table(title="Pods", title_justify="left")
    for col in ("GPU", "NAMESPACE/POD", "CONTAINER"):
        pods.add_column(col)
    if claims:
        pods.add_column("CLAIM")
    for col in ("SHARING", "MEMORY USED", "ENTITLED", "OF SHARE"):
        pods.add_column(col)
    if caps:
        for col in ("SOFT", "HARD", "CAPS"):
            pods.add_column(col)
    for col in ("SM %", "SM SHARE", "PIDS"):
        pods.add_column(col)
    return pods


def _limit(value: Any) -> str:
    return "-" if value is None else _mib(int(value))


def _caps_cells(p: Mapping[str, Any]) -> list[str | Text]:
    """SOFT, HARD, CAPS of one container: the limits the driver returned, and `capped` or
    why not (a container nobody caps, exclusive or MPS, shows `-`)."""
    if p.get("memory_capped"):
        hard = p.get("memory_hard_limit_bytes")
        return [_limit(p.get("memory_soft_limit_bytes")), "max" if hard is None else _limit(hard),
                "capped"]  # fmt: skip
    reason = p.get("memory_caps_reason")
    return ["-", "-", Text(f"not capped: {reason}", style="yellow") if reason else "-"]


def _protection_cell(g: Mapping[str, Any]) -> str | Text:
    """The GPU's protection, and why it is not capped when it is not."""
    kind = g.get("memory_protection") or "-"
    reason = g.get("memory_protection_reason")
    if kind == "capped" or not reason:
        return kind
    return Text(f"{kind} (not capped: {reason})", style="" if kind == "guarded" else "yellow")


def _per_gpu(g: Mapping[str, Any]) -> str:
    text = f"GPU {g['gpu_index']}: {g['devices']}x of {g['memory_mib']} MiB"
    if g.get("entitlement_mib") is not None:
        return text + f" ({g['entitlement_mib']} MiB held)"
    if g.get("replicas", 1) > 1:
        return text + f" (1/{g['replicas']} each)"
    return text


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def render_status(doc: Mapping[str, Any], *, now: float | None = None) -> RenderableType:
    """The daemon's `/status` document as tables (what `gpuslice top` prints)."""
    taken = doc.get("snapshot_taken_at")
    age = (
        "no snapshot yet"
        if taken is None
        else (f"snapshot {(time.time() if now is None else now) - float(taken):.0f}s old")
    )
    config = doc.get("config_name") or "(single config)"
    agent = f"  gpuslice {doc['agent_version']}" if doc.get("agent_version") else ""
    header = Text(f"{doc.get('node_name', '?')}  config {config}  {age}{agent}")
    parts: list[RenderableType] = [header]

    resources = Table(title="Resources", title_justify="left")
    for col in ("RESOURCE", "SHARING", "DEVICES", "ALLOCATED", "PER GPU"):
        resources.add_column(col)
    allocated = doc.get("allocated", {})
    for res in doc.get("resources", []):
        per_gpu = ", ".join(_per_gpu(g) for g in res.get("per_gpu", []))
        resources.add_row(
            res["name"],
            res["strategy"],
            str(res["devices"]),
            str(allocated.get(res["name"], "-")),
            per_gpu,
        )
    parts.append(resources)
    daemons = doc.get("mps_daemons", [])
    if daemons:
        listed = Text("MPS daemons:")
        for d in daemons:
            state = str(d.get("state", "?"))
            listed.append(f"\n  {d.get('resource')}: ")
            listed.append(
                state.upper(), style={"ready": "green", "down": "bold red"}.get(state, "")
            )
        parts.append(listed)

    gpus = Table(title="GPUs", title_justify="left")
    for col in (
        "GPU",
        "UUID",
        "MODEL",
        "MEMORY",
        "UTIL",
        "TEMP",
        "POWER",
        "LAST XID",
        "PROTECTION",
    ):
        gpus.add_column(col)
    for g in doc.get("gpus", []):
        gpus.add_row(
            "?" if g.get("index") is None else str(g["index"]),
            g["uuid"],
            g.get("model", ""),
            (
                f"{g['memory_used_mib']} / {g.get('memory_total_mib', 0)} MiB"
                if g.get("memory_used_mib") is not None
                else "n/a (unified memory)"
            ),
            _pct(g.get("gpu_util_percent")),
            "-" if g.get("temperature_c") is None else f"{g['temperature_c']}C",
            "-" if g.get("power_w") is None else f"{g['power_w']:.0f}W",
            str(g["last_xid"]) if g.get("last_xid") else "-",
            _protection_cell(g),
        )
    parts.append(gpus)

    pod_docs = doc.get("pods", [])
    claims = any(p.get("claims") for p in pod_docs)
    caps = any(g.get("memory_protection") for g in doc.get("gpus", []))
    pods = _pods_table(claims, caps)
    for p in pod_docs:
        share = p.get("memory_share_used")
        over = bool(p.get("over_share"))
        of_share = Text(
            "-" if share is None else f"{100 * share:.0f}%" + (" OVER" if over else ""),
            style="bold red" if over else "",
        )
        pods.add_row(
            str(p["gpu_index"]),
            f"{p['namespace']}/{p['pod']}",
            p["container"],
            *([",".join(p.get("claims", [])) or "-"] if claims else []),
            p["sharing"],
            _mib(int(p["memory_used_bytes"])),
            _mib(int(p["memory_entitled_bytes"])),
            of_share,
            *(_caps_cells(p) if caps else []),
            "-" if p.get("sm_util_percent") is None else f"{p['sm_util_percent']:.0f}",
            "-" if p.get("sm_share") is None else f"{100 * p['sm_share']:.0f}%",
            ",".join(str(x) for x in p.get("pids", [])) or "-",
        )
    parts.append(pods)
    if not doc.get("gpu_metrics", True):
        parts.append(Text("GPU metrics are off in the daemon (--no-gpu-metrics)", style="yellow"))
    others = doc.get("unattributed", [])
    if others:
        lines = [f"pid {o['pid']} on {o['gpu_uuid']}: {o['reason']}" for o in others]
        parts.append(Text("Not attributed to a container:\n  " + "\n  ".join(lines)))
    pr = doc.get("pod_resources", {})
    if pr.get("state") == "missing":
        parts.append(
            Text(
                f"warning: the daemon has no PodResources socket ({pr.get('detail')}): "
                "it cannot tell which pod holds which GPU",
                style="yellow",
            )
        )
    for problem in doc.get("warnings", []):
        parts.append(Text(f"warning: {problem}", style="yellow"))
    return Group(*parts)
