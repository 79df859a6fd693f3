"""`gpuslice top`: nvidia-smi, but per pod: who uses which GPU and how much of its share.

It builds the same snapshot the exporter serves (NVML or a simulated node, the kubelet's
PodResources, /proc) in this process, so it works on a node without Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import click
from rich.live import Live

from gpuslice.backends import open_backend
from gpuslice.cli.common import console, plan_for
from gpuslice.cli.main import reports_errors
from gpuslice.cli.output import emit, output_option, plain
from gpuslice.metrics import SnapshotRefresher
from gpuslice.metrics.top import render_top
from gpuslice.podresources import PodResourcesClient


async def _run(
    node: str,
    config_file: Path | None,
    config_name: str,
    pod_resources: Path,
    proc_root: Path,
    watch: float | None,
    output: str = "table",
) -> None:
    backend = await asyncio.to_thread(open_backend, node)
    has_kubelet = await asyncio.to_thread(pod_resources.exists)
    client = PodResourcesClient(pod_resources) if has_kubelet else None
    try:
        view = await asyncio.to_thread(plan_for, node, config_file, config_name, backend)
        refresher = SnapshotRefresher(
            backend=backend,
            assignments=client,
            current=lambda: (view.plan, view.inventory),
            hostname=socket.gethostname(),
            proc_root=proc_root,
        )
        if output != "table":
            while True:
                # one document per refresh: `-o json -w 5` is a stream scripts can follow
                emit(plain(await refresher.refresh()), output)
                if watch is None:
                    return
                if output == "yaml":
                    click.echo("---")
                await asyncio.sleep(watch)
        con = console()
        if watch is None:
            con.print(render_top(await refresher.refresh()))
            return
        with Live(render_top(None), console=con, refresh_per_second=4) as live:
            while True:
                live.update(render_top(await refresher.refresh()))
                await asyncio.sleep(watch)
    finally:
        if client is not None:
            await client.close()
        await asyncio.to_thread(backend.close)


@click.command()
@click.option("--node", default="nvml", show_default=True, help="nvml, or a simulated node spec.")
@click.option(
    "--config-file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="The config the node runs (for entitlements: the share each pod is owed).",
)
@click.option("--config-name", default="")
@click.option(
    "--pod-resources-socket",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    show_default=True,
)
@click.option(
    "--proc-root", type=click.Path(path_type=Path), default=Path("/proc"), show_default=True
)
@click.option(
    "--watch",
    "-w",
    type=click.FloatRange(min=0.2),
    default=None,
    help="Refresh every N seconds until interrupted.",
)
@output_option
@reports_errors
def top(
    node: str,
    config_file: Path | None,
    config_name: str,
    pod_resources_socket: Path,
    proc_root: Path,
    watch: float | None,
    output: str,
) -> None:
    """Per-pod GPU usage on this node, against each pod's share."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            _run(node, config_file, config_name, pod_resources_socket, proc_root, watch, output)
        )
