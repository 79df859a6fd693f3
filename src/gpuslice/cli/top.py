"""`gpuslice top`: nvidia-smi, but per pod: who uses which GPU and how much of its share.

It reads the running daemon's `/status` (the same snapshot its `/metrics` serves) instead of
rebuilding a view in this process: only the daemon knows the config in force (node label,
ConfigMap), the kubelet's assignments and the pods' names, so only its view is the truth.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.error
import urllib.request

import click
import yaml
from rich.live import Live

from gpuslice.cli.common import console
from gpuslice.cli.errors import BadInput
from gpuslice.core.jsontypes import Json
from gpuslice.metrics.top import render_status

DEFAULT_URL = "http://127.0.0.1:9400"


def default_url(port: str | None) -> str:
    """Inside the agent's pod METRICS_PORT is set (the chart's `metrics.port`), so
    `kubectl exec ... gpuslice top` finds its agent whatever port the chart chose; a
    value that is no port number is the daemon's problem, not `top`'s, so it is ignored."""
    port = (port or "").strip()
    return f"http://127.0.0.1:{port}" if port.isdigit() else DEFAULT_URL


TIMEOUT_S = 5.0


class DaemonUnreachable(BadInput):
    """No `/status` from the daemon at the URL: the one `error:` line of every bad input."""


def fetch_status(url: str) -> Json:
    where = url.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(where, timeout=TIMEOUT_S) as resp:
            doc = json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        raise DaemonUnreachable(
            f"the gpuslice daemon at {url} answered {exc.code} on /status "
            "(an older version, or not a gpuslice daemon)"
        ) from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DaemonUnreachable(
            f"cannot reach the gpuslice daemon at {url}: {reason} "
            "(is `gpuslice plugin --metrics-port` running? pass --url or GPUSLICE_URL)"
        ) from None
    if not isinstance(doc, dict):
        raise DaemonUnreachable(f"{where} did not return a JSON object")
    return doc


@click.command()
@click.option(
    "--url",
    envvar="GPUSLICE_URL",
    default=None,
    show_default="http://127.0.0.1:PORT, else port 9400",
    help="The daemon's endpoint (its --metrics-address and --metrics-port).",
)
@click.option(
    "--port",
    envvar="METRICS_PORT",
    default=None,
    help="The local daemon's --metrics-port (METRICS_PORT in its pod), unless --url is given.",
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json", "yaml"]),
    default="table",
    show_default=True,
)
@click.option(
    "--watch",
    "-w",
    type=click.FloatRange(min=0.2),
    default=None,
    help="Refresh every N seconds until interrupted: a live table on a terminal, one frame "
    "after another when piped (kubectl exec without -t), one JSON document per line or one "
    "YAML document per frame with -o json|yaml.",
)
def top(url: str | None, port: str | None, output: str, watch: float | None) -> None:
    """Per-pod GPU usage on this node, against each pod's share, as the daemon sees it."""
    if url is None:
        url = default_url(port)
    doc = fetch_status(url)
    if watch is None:
        _show(doc, output, stream=False)
        return
    con = console()
    if output == "table" and con.is_terminal:
        with (
            contextlib.suppress(KeyboardInterrupt),
            Live(render_status(doc), console=con, refresh_per_second=4) as live,
        ):
            while True:
                time.sleep(watch)
                live.update(render_status(fetch_status(url)))
        return
    # Not a terminal (a pipe, `kubectl exec` without -t) or a document format: a live view
    # would show nothing until it ends, so each refresh is written out whole, and flushed.
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            _show(doc, output, stream=True)
            time.sleep(watch)
            doc = fetch_status(url)


def _show(doc: Json, output: str, *, stream: bool) -> None:
    """One document or table; streamed, JSON is one line per document (`jq` reads them
    one by one) and YAML documents start with `---`, each flushed as it is written."""
    if output == "json":
        text = (
            json.dumps(doc, sort_keys=True) if stream else json.dumps(doc, indent=2, sort_keys=True)
        )
        click.echo(text)
    elif output == "yaml":
        click.echo(("---\n" if stream else "") + yaml.safe_dump(doc, sort_keys=True), nl=False)
    else:
        console().print(render_status(doc))
    if stream:
        sys.stdout.flush()


__all__ = ["DEFAULT_URL", "fetch_status", "top"]
