"""`gpuslice advise`: right-size GPU sharing from what the pods actually used.

Reads the exporter's history (Prometheus, or a file of samples), asks the core for a plan
per GPU model, and prints it; optionally writes the plan as a ConfigMap of named configs
and draws each pod's memory against the recommended share.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import click
import yaml

from gpuslice.cli.advise_render import render_advice
from gpuslice.cli.common import console
from gpuslice.cli.errors import reports_errors
from gpuslice.cli.output import emit, output_option
from gpuslice.core.advise import (
    POD_MEMORY,
    Advice,
    AdviseError,
    History,
    RawSeries,
    advice_to_dict,
    advise,
    build_history,
    named_configs,
    parse_duration,
)
from gpuslice.core.advise.claims import mig_claim_templates
from gpuslice.textfile import UnreadableFile, read_text

DEFAULT_SINCE = "24h"
DEFAULT_STEP = "15s"
MAX_SINCE_S = 5 * 366 * 86400
"""Five years: longer than any Prometheus keeps; `--since 1e12` is a typo, not a range."""
MAX_STEP_S = 86400.0
"""A day: coarser than that, no pod's peak or trend is left to size from."""
MAX_UNTIL_S = 253402300799.0
"""9999-12-31T23:59:59Z, the last time ISO 8601 and `datetime` can write."""
MAX_TIMEOUT_S = 3600.0


def _until(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        try:
            value = datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise AdviseError(
                f"--until: expected Unix seconds or an ISO 8601 time "
                f"(2026-11-25T12:00:00+00:00), got {text!r}"
            ) from None
    if not (math.isfinite(value) and 0 <= value <= MAX_UNTIL_S):
        raise AdviseError(f"--until: expected a time between 1970 and 9999, got {text!r}")
    return value


def _since(text: str) -> float:
    seconds = parse_duration(text, "--since")
    if seconds > MAX_SINCE_S:
        raise AdviseError(f"--since: at most 5 years ({MAX_SINCE_S:.0f} s), got {text!r}")
    return seconds


def _step(text: str) -> float:
    seconds = parse_duration(text, "--step")
    if seconds > MAX_STEP_S:
        raise AdviseError(f"--step: at most a day ({MAX_STEP_S:.0f} s), got {text!r}")
    return seconds


def load_history(
    prometheus: str | None,
    samples: Path | None,
    since: str | None,
    until: str | None,
    step: str | None,
    timeout_s: float = 60.0,
    *,
    max_file_bytes: int | None = None,
) -> History:
    """The history from whichever source was given, over the asked window. A samples
    file is held to `max_file_bytes` (`prometheus.samples.MAX_FILE_BYTES`: one answer's
    bound), its size checked before a byte of it is read."""
    end = _until(until)
    if prometheus is not None:
        from gpuslice.prometheus.client import PrometheusReader, Window

        step_s = _step(step or DEFAULT_STEP)
        end = time.time() if end is None else end
        start = end - _since(since or DEFAULT_SINCE)
        window = Window(start, end, step_s)
        series = PrometheusReader(prometheus, timeout_s=timeout_s).series(window, _progress())
        return build_history(series, step_s, start=start, end=end)
    assert samples is not None
    from gpuslice.prometheus.samples import (
        MAX_FILE_BYTES,
        file_too_large,
        parse_samples,
        scrape_interval,
    )

    limit = MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
    try:
        text = read_text(samples, limit)[0]
    except UnreadableFile as exc:
        if exc.size is None or exc.size <= limit:
            raise
        raise file_too_large(str(samples), exc.size, limit) from None
    series = parse_samples(text, str(samples))
    begin: float | None = None
    if end is not None or since is not None:
        last = max((t for s in series for t, _ in s.points if math.isfinite(t)), default=0.0)
        end = last if end is None else end
        begin = end - _since(since) if since is not None else None
        lo = -math.inf if begin is None else begin
        series = [
            RawSeries(s.name, s.labels, [(t, v) for t, v in s.points if lo <= t <= end])
            for s in series
        ]
    if not any(s.name == POD_MEMORY and s.points for s in series):
        raise AdviseError(
            f"{samples}: no {POD_MEMORY} series in the range (with timestamps): this is not "
            "gpuslice's exporter's history"
        )
    step_or_none = _step(step) if step else scrape_interval(series)
    if step_or_none is None:
        raise AdviseError(
            f"{samples}: no per-pod series with two samples or more in the range: "
            "nothing to tell a scrape interval or a trend from"
        )
    return build_history(series, step_or_none, start=begin, end=end)


def _progress() -> Callable[[str], None] | None:
    """What advise is reading, on a terminal's stderr (a week of a fleet takes a while);
    none in a pipe or a script, whose stderr is for the one `error:` line."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()

    def say(line: str) -> None:
        click.echo(f"advise [{time.monotonic() - started:4.1f}s] {line}", err=True)

    return say


def config_map_text(advice: Advice, name: str = "gpuslice-advise") -> str:
    """The ConfigMap, with the node labels that select each config as comments.

    The model name comes from a `modelName` label anyone who can write a series controls:
    in a comment it is written as a JSON string, ASCII only, so no newline, `---`, control
    character or Unicode line separator can end the comment and add a document to the file
    the admin applies. Everything else goes through `yaml.safe_dump`."""
    configs = named_configs(advice)
    head = ["# Written by `gpuslice advise`: one named config per GPU model."]
    head += [
        f"#   {json.dumps(c.model)}: replicas {c.replicas}; select with "
        f"kubectl label node <node> {c.label} --overwrite"
        for c in configs
    ]
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {c.name: yaml.safe_dump(c.config, sort_keys=False) for c in configs},
    }
    return "\n".join(head) + "\n" + yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False)


def claims_text(advice: Advice) -> str:
    """The ResourceClaimTemplates of `core.advise.claims`, one YAML document each, with the
    pods each profile suits as comments (pod names come from series labels: written as
    JSON strings, as `config_map_text` writes model names)."""
    templates = mig_claim_templates(advice)
    if not templates:
        return "# Written by `gpuslice advise`: no pod fits a MIG profile of a known model.\n"
    docs = []
    for t in templates:
        head = [f"# {t.profile} on {json.dumps(t.model)}, for {len(t.pods)} pod(s):"]
        head += [f"#   {json.dumps(p)}" for p in t.pods]
        docs.append("\n".join(head) + "\n" + yaml.safe_dump(t.doc, sort_keys=False))
    return "---\n".join(docs)


class _BlockDumper(yaml.SafeDumper):
    """Each config as a `|` block, as people write ConfigMaps, not a quoted string."""


def _block(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _block)


@click.command("advise")
@click.option("--prometheus", metavar="URL", help="Prometheus that scrapes gpuslice's exporter.")
@click.option(
    "--samples",
    type=click.Path(path_type=Path),
    default=None,
    help="A file of samples with timestamps (Prometheus text or OpenMetrics) instead.",
)
@click.option(
    "--since",
    default=None,
    help=f"How far back to look (Prometheus durations: 6h, 7d) [default: {DEFAULT_SINCE}; "
    "--samples: the whole file].",
)
@click.option("--until", default=None, help="End of the range: Unix seconds or ISO 8601 [now].")
@click.option(
    "--step",
    default=None,
    help=f"The scrape interval [default: {DEFAULT_STEP}; --samples: the file's own].",
)
@click.option(
    "--headroom",
    type=click.FloatRange(0, 1000),
    default=10.0,
    show_default=True,
    help="Percent added to each pod's observed peak.",
)
@click.option(
    "--current-replicas",
    type=click.IntRange(1, 1024),
    default=None,
    help="Replicas the pods ran under, for the replay [default: from the entitlement series].",
)
@click.option(
    "--write-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write a ConfigMap of named configs (one per GPU model) that `describe` accepts.",
)
@click.option(
    "--write-claims",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write ResourceClaimTemplates, one per MIG profile the pods fit, for GPUs in "
    "dynamic MIG (docs/dra.md).",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Draw each pod's memory against the recommended share as a PNG "
    "(needs the `plot` extra: pip install 'gpuslice[plot]').",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds per request, the whole request (redirects and a slow answer included).",
)
@output_option
@reports_errors
def advise_command(
    prometheus: str | None,
    samples: Path | None,
    since: str | None,
    until: str | None,
    step: str | None,
    headroom: float,
    current_replicas: int | None,
    write_config: Path | None,
    write_claims: Path | None,
    plot: Path | None,
    timeout: float,
    output: str,
) -> None:
    """Recommend time-slicing replicas, MPS limits, MIG layouts and DRA requests per GPU
    model from what the pods used, and replay the history at that size.

    Leakers (still growing at the end of their life) and idle pods are named and left out
    of the sizing. Exit code 2 for unreadable input or an unreachable Prometheus.
    """
    if (prometheus is None) == (samples is None):
        raise click.UsageError("give one of --prometheus URL or --samples FILE")
    if plot is not None:
        from gpuslice.cli.advise_plot import check_available

        check_available()
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise AdviseError(f"--timeout: expected seconds above 0, at most 3600, got {timeout}")
    history = load_history(prometheus, samples, since, until, step, timeout)
    for line in history.warnings:
        click.echo(f"warning: {line}", err=True)
    advice = advise(history, headroom, current_replicas)
    if output == "table":
        render_advice(advice, history, console())
    else:
        emit(advice_to_dict(advice), output)
    if write_config is not None:
        write_config.write_text(config_map_text(advice))
        click.echo(f"wrote {write_config}", err=True)
    if write_claims is not None:
        write_claims.write_text(claims_text(advice))
        click.echo(f"wrote {write_claims}", err=True)
    if plot is not None:
        from gpuslice.cli.advise_plot import draw

        draw(advice, history, plot)
        click.echo(f"wrote {plot}", err=True)
