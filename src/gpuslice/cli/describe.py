"""`gpuslice describe`: what a config does on a node, before it is applied.

With `--claims`, the same question for a node in DRA mode: what each ResourceClaim of a
file would be allocated and what Prepare would give its containers
(`gpuslice.whatif.claims`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from gpuslice.agent.caps import node_capability
from gpuslice.agent.knobs import knob_field
from gpuslice.agent.settings import AgentSettings, CapsSettings, DraSettings, GuardSettings
from gpuslice.backends import memory_limiter_of, open_backend
from gpuslice.cli.common import NodeView, console, daemon_option, plan_for
from gpuslice.cli.errors import reports_errors
from gpuslice.cli.output import emit, output_option
from gpuslice.core.caps import CapsMode, GpuCapability, caps_view, gpu_capability
from gpuslice.core.describe import DescribeReport, gib, report_to_dict
from gpuslice.core.describe import describe as describe_plan
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.publish import REPLICAS, SharesMode
from gpuslice.core.guard.model import GuardMode
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.host.configfiles import MAX_BYTES
from gpuslice.ports import GpuBackend
from gpuslice.textfile import read_text

if TYPE_CHECKING:
    from gpuslice.whatif.claims import ClaimOutcome, SliceDevice, WhatIf

EXIT_NOT_ALL_FIT = 1
"""`describe --claims`: at least one claim would not be allocated or prepared."""

MAX_CLAIMS_BYTES = MAX_BYTES
"""Largest claims or DeviceClass file read: a config file's cap (1 MiB), thousands of
claims, more than one node could hold."""


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
        protected = _PROTECTION_WORDS.get(g.protection, "")
        if protected and g.protection_reason:
            protected += f" ({g.protection_reason})"
        gpus.add_row(
            str(g.index),
            f"{g.product}\n[dim]{g.uuid}[/dim]"
            + (f"\n[dim]{protected}[/dim]" if protected else ""),
            f"{gib(g.memory_mib)} GiB" if g.memory_mib else "n/a (unified)",
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


def _protection(
    backend: GpuBackend,
    inventory: Inventory,
    cgroup_root: Path,
    caps_mode: CapsMode,
    guard_mode: GuardMode,
) -> dict[str, tuple[str, str]]:
    """Each GPU's memory protection as the agent on this node would find it: the driver's
    limits call, MIG, cgroup v2, root and the pods' cgroups under `cgroup_root` (the
    agent's `--cgroup-root`: run in the agent's pod, the chart's mount of the host's tree),
    and the caps and guard modes the agent's own options give (`--memory-caps`,
    `--memory-guard`, read from the same variables). A prediction: the agent reports a
    GPU capped only once it has read limits back there."""
    limiter = memory_limiter_of(backend)
    has_call = False
    if limiter is not None and caps_mode != "off":
        try:
            has_call = limiter.memory_limits_supported()
        except Exception:  # a probe must not fail describe
            has_call = False
    node = node_capability(cgroup_root)
    capabilities: dict[str, GpuCapability] = {
        g.uuid: gpu_capability(
            g.uuid, mode=caps_mode, mig_enabled=g.mig_enabled,
            memory_reported=g.memory_reported, driver_has_call=has_call, node=node,
        )
        for g in inventory.gpus
    }  # fmt: skip
    return dict(caps_view(capabilities, guard_mode, {}).protection)


_PROTECTION_WORDS = {
    "capped": "memory: capped by the driver",
    "guarded": "memory: guarded by the memory guard",
    "none": "memory: no protection",
}


@click.command("describe")
@daemon_option(AgentSettings, "config_path")
@daemon_option(AgentSettings, "config_name")
@daemon_option(AgentSettings, "default_config")
@daemon_option(AgentSettings, "node")
@click.option(
    "--claims",
    "claims_file",
    type=click.Path(path_type=Path),
    default=None,
    help="ResourceClaims (YAML, several documents or a kind: List): what each would get "
    "from this node in DRA mode, in file order.",
)
@click.option(
    "--device-classes",
    "classes_file",
    type=click.Path(path_type=Path),
    default=None,
    help="DeviceClasses to use with --claims instead of NVIDIA's gpu.nvidia.com and "
    "mig.nvidia.com.",
)
@daemon_option(DraSettings, "consumable_shares")
@daemon_option(AgentSettings, "cgroup_root")
@daemon_option(CapsSettings, "mode")
@daemon_option(GuardSettings, "mode")
@output_option
@reports_errors
def describe_command(
    config_path: Path | None,
    config_name: str,
    default_config: str,
    node: str,
    claims_file: Path | None,
    classes_file: Path | None,
    consumable_shares: str,
    cgroup_root: Path,
    memory_caps: CapsMode,
    memory_guard: GuardMode,
    output: str,
) -> None:
    """Show what this node would advertise with a config, and what each replica gets.

    With --claims: what each ResourceClaim would be allocated on this node in DRA mode
    (the config decides which GPUs are offered as shares), how the device is shared, the
    env its containers get and what the memory guard allows each pod. Exit code 1 when a
    claim would not fit, 2 for unreadable input.
    """
    if classes_file is not None and claims_file is None:
        raise click.UsageError("--device-classes goes with --claims")
    try:
        mode: SharesMode = knob_field(DraSettings, "consumable_shares").value(consumable_shares)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--consumable-shares'") from None
    backend = open_backend(node)
    try:
        view = plan_for(node, config_path, config_name, backend, default_config=default_config)
        protection = _protection(backend, view.inventory, cgroup_root, memory_caps, memory_guard)
    finally:
        backend.close()
    if claims_file is not None:
        _describe_claims(view, claims_file, classes_file, output, mode)
        return
    report = describe_plan(view.plan, view.inventory, protection)
    if output == "table":
        _render_table(view, report, console())
    else:
        emit(report_to_dict(report), output)


def _describe_claims(
    view: NodeView,
    claims_file: Path,
    classes_file: Path | None,
    output: str,
    shares: SharesMode = REPLICAS,
) -> None:
    # the allocator imports celpy: loaded only when claims are asked about
    from gpuslice.whatif.claims import (
        DEFAULT_DEVICE_CLASSES,
        load_claims,
        load_device_classes,
        what_if,
        what_if_to_dict,
    )

    claims = load_claims(_read(claims_file), str(claims_file))
    classes = (
        load_device_classes(_read(classes_file), str(classes_file))
        if classes_file is not None
        else list(DEFAULT_DEVICE_CLASSES)
    )
    report = what_if(
        view.inventory, view.plan, claims, classes, shares=shares, dynamic=view.plan.dynamic_mig
    )
    if output == "table":
        title = f"node {view.backend_name} · DRA driver {report.driver}"
        if view.config_name:
            title += f" · config {view.config_name}"
        render_what_if(report, console(), title)
    else:
        emit(what_if_to_dict(report), output)
    if not report.all_fit:
        sys.exit(EXIT_NOT_ALL_FIT)


def _read(path: Path) -> str:
    """Read as config files are: a FIFO, a directory, a loop or a 300 MB file is one
    `error:` line naming the file (`UnreadableFile`), not a hang, a traceback or a read
    that fills memory. The path is not checked by click first: its "does not exist" would
    hide why a symlink loop or a dangling link cannot be read."""
    return read_text(path, MAX_CLAIMS_BYTES)[0]


def slices_table(devices: Sequence[SliceDevice], title: str) -> Table:
    """A node's published devices: one row per device."""
    table = Table(title=title, title_justify="left")
    table.add_column("device", no_wrap=True)
    table.add_column("type")
    table.add_column("product / profile")
    table.add_column("memory", justify="right")
    table.add_column("offered as")
    for d in devices:
        offered = "whole device"
        if d.shares:
            offered = (
                f"{d.shares} shares, {gib(d.share_memory_mib)} GiB each by default"
                if d.share_memory_mib
                else f"{d.shares} shares (by count: no memory capacity)"
            )
        table.add_row(
            d.name,
            d.type,
            d.product + (f" · MIG {d.profile}" if d.profile else ""),
            f"{gib(d.memory_mib)} GiB" if d.memory_mib else "n/a (unified)",
            offered,
        )
    if not devices:
        table.add_row("(no devices)", "", "", "", "")
    return table


def claims_table(claims: Sequence[ClaimOutcome], title: str) -> Table:
    """Per claim and request: the device, its sharing, the container env, the guard's limit."""
    table = Table(title=title, title_justify="left", show_lines=True, expand=True)
    table.add_column("claim", no_wrap=True)
    table.add_column("request → device", no_wrap=True)
    table.add_column("sharing", min_width=20, ratio=3)
    table.add_column("container env (CDI)", min_width=24, ratio=5, overflow="fold")
    table.add_column("guard, per pod", min_width=14, ratio=2)
    for c in claims:
        label = f"{c.namespace}/{c.name}"
        if not c.fits:
            table.add_row(f"[red]{label}[/red]", f"[red]not {c.stage}d[/red]", c.error, "", "")
            continue
        for n, d in enumerate(c.devices):
            what = d.device + (f"\n[dim]MIG {d.profile}[/dim]" if d.profile else "")
            if d.placement is not None:
                what += f"\n[dim]memory slices {d.placement}[/dim]"
            if d.created_at_prepare:
                what += "\n[dim](created at Prepare: dynamic MIG)[/dim]"
            env = "\n".join(f"{k}={short_ids(v)}" for k, v in d.env)
            for m in d.mounts:
                env += f"\n[dim]mount {m.container_path} ← {short_ids(m.host_path)}[/dim]"
            guard = f"{d.entitlement.entitlement_kind}: {gib(d.entitlement_mib)} GiB"
            if not d.memory_mib:  # unified memory: nothing for the guard to hold
                guard = f"{d.entitlement.entitlement_kind}: no memory figure, not guarded"
            if d.sm_fraction is not None and d.entitlement is not SharingStrategy.NONE:
                guard += f", {d.sm_fraction:.0%} of SMs"
            if c.guard_mode:
                guard += f"\n[dim]GuardConfig mode {c.guard_mode}[/dim]"
            sharing = d.sharing_text
            if n == 0 and c.warnings:  # once per claim, as the Warning Events are
                sharing += "".join(f"\n[yellow]warning: {w}[/yellow]" for w in c.warnings)
            table.add_row(label, f"{d.request} → {what}", sharing, env, guard)
    return table


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def short_ids(text: str) -> str:
    """UUIDs (GPU, MIG, claim) cut to their first 8 hex digits, `GPU-79225abe…`: enough to
    tell them apart in a table; `-o json` has them whole."""
    return _UUID.sub(lambda m: m.group(0)[:8] + "…", text)


def render_what_if(report: WhatIf, console: Console, title: str) -> None:
    console.print(f"[bold]{title}[/bold]")
    console.print(slices_table(report.devices, "ResourceSlices this node would publish"))
    console.print(claims_table(report.claims, "what each claim would get (in file order)"))
    fit = sum(1 for c in report.claims if c.fits)
    console.print(f"{fit} of {len(report.claims)} claims fit.")
