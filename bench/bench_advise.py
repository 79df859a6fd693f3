#!/usr/bin/env python3
"""How long `gpuslice advise` takes on a fleet's week, as a ratio to the Prometheus
queries it needs alone.

1,000 seeded synthetic pods (`gpuslice.testing.workloads.fleet`: 1 to 24 h each, arriving
over 7 days on H100s at replicas 4, 2 % leakers, 5 % idle) scraped every 15 s, loaded into
a real Prometheus with `promtool tsdb create-blocks-from openmetrics`. The baseline is the
exact HTTP requests advise makes (`requests_for`), answers read to the last byte and not
parsed; advise is the whole command's work in-process: the same requests, the JSON parsed,
the series lined up, the sizing, the replay at two sizes (guard off and enforcing), the
JSON report. Median of `--rounds` each, interleaved.

    .venv/bin/python bench/bench_advise.py [--pods 1000] [--days 7] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpuslice.core.advise import advice_to_dict, advise, build_history
from gpuslice.prometheus.client import PrometheusReader, Window, requests_for
from gpuslice.testing import promserver
from gpuslice.testing.workloads import fleet, write_openmetrics

STEP_S = 15.0


def queries_alone(url: str, window: Window) -> tuple[float, int]:
    """Seconds and bytes for advise's requests, answers read but not parsed."""
    reader = PrometheusReader(url)
    started = time.perf_counter()
    size = 0
    for request in requests_for(window):
        with urllib.request.urlopen(reader.url_of(request), timeout=600) as r:
            size += len(r.read())
    return time.perf_counter() - started, size


def advise_once(url: str, window: Window) -> dict[str, float]:
    """Seconds for each part of one advise run."""
    t0 = time.perf_counter()
    series = PrometheusReader(url, timeout_s=600).series(window)
    t1 = time.perf_counter()
    history = build_history(series, window.step_s, start=window.start)
    t2 = time.perf_counter()
    advice = advise(history, 10.0, with_replay=False)
    t3 = time.perf_counter()
    advice = advise(history, 10.0)
    advice_to_dict(advice)
    t4 = time.perf_counter()
    return {
        "total": (t1 - t0) + (t2 - t1) + (t4 - t3),
        "fetch+parse": t1 - t0,
        "line up": t2 - t1,
        "sizing": t3 - t2,
        "sizing+replay": t4 - t3,
        "models": float(len(advice.models)),
        "replicas": float(advice.models[0].time_slicing.replicas)
        if advice.models and advice.models[0].time_slicing
        else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="60 pods over 12 h, one round")
    args = parser.parse_args()
    if args.quick:
        args.pods, args.days, args.rounds = 60, 0.5, 1
    why_not = promserver.missing()
    if why_not is not None:
        print(f"bench_advise needs a real Prometheus: {why_not}", file=sys.stderr)
        sys.exit(1)
    end = float(int(time.time()) // STEP_S * STEP_S - 60)
    with tempfile.TemporaryDirectory(prefix="bench-advise-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        workload = fleet(end, pods=args.pods, days=args.days, step_s=STEP_S)
        with (work / "fleet.om").open("w") as out:
            write_openmetrics([workload], out)
        size_mb = (work / "fleet.om").stat().st_size / 1e6
        t_gen = time.perf_counter() - t
        t = time.perf_counter()
        promserver.create_blocks(work / "fleet.om", work / "tsdb", max_block_hours=24)
        t_load = time.perf_counter() - t
        (work / "fleet.om").unlink()
        samples = sum((p.samples or workload.points - p.start) for p in workload.pods)
        print(
            f"{args.pods} pods on {workload.gpus} H100s over {args.days:g} days at {STEP_S:g} s: "
            f"{samples:,} samples per pod metric, OpenMetrics {size_mb:.0f} MB written in "
            f"{t_gen:.1f} s, promtool blocks in {t_load:.1f} s"
        )
        window = Window(end - args.days * 86400, end + STEP_S, STEP_S)
        with promserver.serving(work / "tsdb", work) as url:
            n_requests = len(requests_for(window))
            queries_alone(url, window)  # warm Prometheus's page cache once, for both
            base: list[float] = []
            runs: list[dict[str, float]] = []
            size = 0
            for _ in range(args.rounds):
                seconds, size = queries_alone(url, window)
                base.append(seconds)
                runs.append(advise_once(url, window))
    q = statistics.median(base)
    total = statistics.median(r["total"] for r in runs)
    fetch = statistics.median(r["fetch+parse"] for r in runs)
    print(f"queries alone: {n_requests} requests, {size / 1e6:.0f} MB, median {q:.2f} s")
    for part in ("fetch+parse", "line up", "sizing", "sizing+replay"):
        print(f"  advise {part}: median {statistics.median(r[part] for r in runs):.2f} s")
    print(f"advise in all: median {total:.2f} s ({args.rounds} rounds)")
    print(
        f"Closing note: advise over {args.pods} pods x {args.days:g} days at {STEP_S:g} s "
        f"took {total:.1f} s, {total / q:.2f}x the {n_requests} Prometheus queries it needs "
        f"alone ({q:.2f} s); fetching and parsing {fetch / q:.2f}x, the replay the rest."
    )


if __name__ == "__main__":
    main()
