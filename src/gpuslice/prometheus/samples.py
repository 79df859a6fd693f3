"""A file of samples, as `advise --samples` reads it: the Prometheus text format or
OpenMetrics, each sample with its timestamp (a dump, or series written by hand or by
`gpuslice.testing.workloads`). prometheus_client's own parsers read it, so what the
exporter writes and what is read back follow one grammar; the bytes are read by the
caller under a size cap."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from gpuslice.core.advise import SERIES_READ, AdviseError, RawSeries
from gpuslice.core.units import MIB
from gpuslice.prometheus.client import MAX_ANSWER_SAMPLES, MAX_BODY_BYTES, MAX_SAMPLES, MAX_SERIES

MAX_FILE_BYTES = MAX_BODY_BYTES
"""The largest samples file read: the bound of one answer from Prometheus (64 MiB). A file
is read and parsed whole, as one answer is; a 200 MB file took 1.5 GB. Longer histories
belong in Prometheus, which `advise` reads in chunks."""


def file_too_large(source: str, size: int, limit: int = MAX_FILE_BYTES) -> AdviseError:
    """The one error for a samples file over the bound, worded as Prometheus's."""
    return AdviseError(
        f"{source}: {size:,} bytes, over {limit // MIB} MiB ({limit} bytes, the "
        "most advise reads from a file, as from one Prometheus answer): give the history "
        "through --prometheus, which advise reads in chunks, or cut the file"
    )


def parse_samples(text: str, source: str) -> list[RawSeries]:
    """The series `advise` reads, grouped by name and labels, points in time order.
    OpenMetrics when the text ends with `# EOF`, else the text format. Held to the same
    series and sample caps as an answer from Prometheus: a 64 MiB file of tiny samples
    is gigabytes as Python objects."""
    lines = text.count("\n") + 1
    if lines > MAX_ANSWER_SAMPLES + 2 * MAX_SERIES + 8:
        # every sample is a line, and the parser builds each before any is dropped: counted
        # first, as an answer from Prometheus is held to its samples before it is parsed
        raise AdviseError(
            f"{source}: more than {MAX_ANSWER_SAMPLES:,} samples in one file (the most advise "
            "reads in one piece, as from one Prometheus answer)"
        )
    is_openmetrics = text.rstrip().endswith("# EOF")
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    untimed = kept = 0
    try:
        # prometheus_client's text parser has no annotations
        families = (
            openmetrics_families(text) if is_openmetrics else text_families(text)  # type: ignore[no-untyped-call]
        )
        for family in families:
            for sample in family.samples:
                if sample.name not in SERIES_READ:
                    continue
                if sample.timestamp is None:
                    untimed += 1
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                points = grouped.get(key)
                if points is None:
                    if len(grouped) >= MAX_SERIES:
                        raise AdviseError(
                            f"{source}: more than {MAX_SERIES:,} series (the most advise reads)"
                        )
                    points = grouped[key] = []
                points.append((float(sample.timestamp), float(sample.value)))
                kept += 1
                if kept > MAX_SAMPLES:
                    raise AdviseError(
                        f"{source}: more than {MAX_SAMPLES:,} samples (the most advise reads)"
                    )
    except ValueError as exc:
        kind = "OpenMetrics" if is_openmetrics else "Prometheus text format"
        raise AdviseError(f"{source}: not valid {kind}: {exc}") from None
    if not grouped and untimed:
        raise AdviseError(
            f"{source}: {untimed} samples without a timestamp: advise needs history, one "
            "timestamp per sample (`name{labels} value timestamp`)"
        )
    return [
        RawSeries(name, dict(labels), sorted(points)) for (name, labels), points in grouped.items()
    ]


def scrape_interval(series: Iterable[RawSeries]) -> float | None:
    """The median gap between consecutive samples of the per-pod series: the step the
    history is lined up on when none is given."""
    gaps = [
        b[0] - a[0]
        for s in series
        if s.name.startswith("gpuslice_pod_")
        for a, b in zip(s.points, s.points[1:], strict=False)
        if b[0] > a[0]
    ]
    return statistics.median(gaps) if gaps else None
