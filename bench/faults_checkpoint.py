#!/usr/bin/env python3
"""A corrupt DRA checkpoint at start, through the real `gpuslice plugin --dra` process.

For every entry of `gpuslice.testing.hostile_checkpoints` (deep nesting, huge numbers,
wrong checksum, truncated, binary, empty, a directory, a FIFO, a symlink loop, 100 MB,
path-hostile names), one daemon starts with that entry at its checkpoint's path. Measured
in one run, against starts with a good checkpoint (the baseline, first and last):

- start to serving: from the process start until the kubelet emulator holds the driver's
  registration and the API double the node's slices, as a multiple of a good start;
- whether a Prepare and its Unprepare then succeed, and whether the bad entry was kept aside.

    .venv/bin/python bench/faults_checkpoint.py [--quick]

`--quick` runs four entries (deep nesting, a FIFO, 100 MB, a path-hostile UID).
`bench_faults.py` runs it as one of its scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from faults_claims import dra_node, timed_cycle

from gpuslice.core.dra.prepared import Checkpoint, encode
from gpuslice.host.checkpoint_file import CHECKPOINT_NAME
from gpuslice.testing.hostile_checkpoints import HOSTILE

QUICK = ("deep nesting (200,000 '[')", "a FIFO", "100 MB", "path-hostile claim UID, sealed")


def _good(plugin_dir: Path) -> None:
    (plugin_dir / CHECKPOINT_NAME).write_bytes(encode(Checkpoint()))


def _bad(make: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda plugin_dir: make(plugin_dir / CHECKPOINT_NAME)


async def _start(before: Callable[[Path], None]) -> tuple[float, bool, bool]:
    """(seconds to serving, Prepare and Unprepare succeeded, bad entry kept aside)."""
    t0 = time.perf_counter()
    async with dra_node(before) as node:
        serving = time.perf_counter() - t0
        ref = node.claim("c1", "gpu-0")
        try:
            await timed_cycle(node, ref)
            served = True
        except SystemExit:
            served = False
        kept = any(
            p.name.startswith(f"{CHECKPOINT_NAME}.corrupt-") for p in node.plugin_dir.iterdir()
        )
    return serving, served, kept


async def scenario_checkpoint(quick: bool) -> str:
    """Runs the scenario, prints its table and returns its one-line summary."""
    entries = [e for e in HOSTILE if e in QUICK] if quick else list(HOSTILE)
    good = [(await _start(_good))[0]]
    rows = [(e, await _start(_bad(HOSTILE[e]))) for e in entries]
    good.append((await _start(_good))[0])
    base = statistics.median(good)
    print(f"\ncorrupt checkpoint at start (good start: {base * 1e3:.0f} ms, median of 2)")
    print(f"{'what was at the path':<44}{'serving x':>10}{'Prepare':>9}{'kept':>6}")
    for entry, (serving, served, kept) in rows:
        print(f"{entry:<44}{serving / base:>10.2f}{'ok' if served else 'FAIL':>9}"
              f"{'yes' if kept else 'NO':>6}")  # fmt: skip
    ok = sum(1 for _, (_, served, kept) in rows if served and kept)
    worst = max(serving for _, (serving, _, _) in rows) / base
    summary = (
        f"{ok} of {len(rows)} corrupt checkpoints left an agent serving Prepare with the bad "
        f"entry kept aside, the slowest start {worst:.2f}x a good one"
    )
    print(summary)
    if ok != len(rows):
        raise SystemExit("a corrupt checkpoint kept the agent from serving")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="four entries instead of all")
    summary = asyncio.run(scenario_checkpoint(parser.parse_args().quick))
    print(f"Closing note: {summary}.")


if __name__ == "__main__":
    main()
