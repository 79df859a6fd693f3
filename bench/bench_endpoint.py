#!/usr/bin/env python3
"""The agent's HTTP endpoint under load, as ratios and counts.

A registry of 64 counters with 8 label values each (a few hundred samples, like a busy
node). Measured in one run, against the same server:

- baseline: the median of N sequential `/metrics` scrapes;
- a burst of 200 concurrent scrapes (200 client threads): wall time as a multiple of the
  baseline, so ~200x means they were served one after another without stalls, and
  "seconds" would show up as thousands;
- 300 idle connections held open: the server's thread count before and after (it must not
  grow: connections live on the event loop) and the scrape median meanwhile, as a ratio.

    .venv/bin/python bench/bench_endpoint.py [--rounds 100] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, Counter

from gpuslice.metrics import MetricsServer
from gpuslice.metrics.server import ServerLimits

OPEN_LIMITS = ServerLimits(
    max_connections=512, max_per_address=512, max_scrapes=512, head_timeout_s=60.0
)
"""The caps raised above the load, since every client here is one loopback address: this
bench measures the rendering and the event loop, `faults_probes.py` the caps and deadlines."""

QUICK_ROUNDS = 20
"""`--quick`: enough scrapes for a median that shows the script works, not a measurement."""


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    for i in range(64):
        c = Counter(f"bench_things_{i}", "things", ["gpu"], registry=reg)
        for g in range(8):
            c.labels(str(g)).inc(i * g)
    return reg


def scrape(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        resp.read()
    return time.perf_counter() - start


def median_scrape(url: str, rounds: int) -> float:
    return statistics.median(scrape(url) for _ in range(rounds))


def main(rounds: int) -> None:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = MetricsServer(registry(), host="127.0.0.1", limits=OPEN_LIMITS)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result()
    url = server.url
    try:
        base = median_scrape(url, rounds)
        with ThreadPoolExecutor(max_workers=200) as pool:
            start = time.perf_counter()
            list(pool.map(scrape, [url] * 200))
            burst = time.perf_counter() - start
        threads_before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
        time.sleep(0.5)
        threads_idle = threading.active_count()
        under_idle = median_scrape(url, rounds)
        for s in idle:
            s.close()
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
    print(f"baseline scrape: {base * 1000:.2f} ms (median of {rounds})")
    print(f"200 concurrent scrapes: {burst * 1000:.0f} ms wall = {burst / base:.0f}x one scrape")
    print(f"threads with 300 idle connections: {threads_idle} (before: {threads_before})")
    print(f"scrape with 300 idle connections open: ratio {under_idle / base:.2f} to baseline")
    print(
        f"Closing note: 200 concurrent scrapes took {burst / base:.0f}x one scrape; with 300 "
        f"idle connections open a scrape took {under_idle / base:.2f}x and the server's "
        f"threads went from {threads_before} to {threads_idle}."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=100, help="sequential scrapes per median")
    parser.add_argument("--quick", action="store_true", help="20 rounds: a smoke run")
    args = parser.parse_args()
    main(QUICK_ROUNDS if args.quick else args.rounds)
