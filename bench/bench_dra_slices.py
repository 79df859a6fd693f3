#!/usr/bin/env python3
"""ResourceSlice publishing for 8 GPUs in MIG mode, as ratios to one API round trip.

The real `SlicePublisher.publish_once()` on the simulated node `sim:8xa100-80gb/mig=1g.10gb*7`
(8 A100 80GB, seven 1g.10gb instances each: 56 MIG devices, one slice) writes through
`DraApi` and lightkube to the Kubernetes API double (`gpuslice.testing.apiserver`), which
runs in its own process (`dra_api_double.py`), as a real API server is another machine.
Every number is set against one API round trip through the same lightkube client (a GET
of the Node), measured in the same run with the operations interleaved (rotating which
goes first), so noise hits all alike.

Each round: the slices are wiped (the kubelet's wipe, untimed), then in order
- first publish: a new publisher (as after the agent's start): GET Node for its UID, list,
  create, list again;
- no-change resync: the same publisher again (what every resync tick costs: a list);
- for reference, `DraApi.list_slices()` alone (one GET of the ~50 kB slice; most of a
  resync, and of the time the double spends serving);
- health change: one GPU unhealthy (XID 79; its 7 MIG devices get taints), so the pool is
  republished with a new generation;
and, rotated with that sequence: the baseline GET and the pure part alone, in this process
with no I/O: `wanted_devices` (`dra_devices` + taints + `device_json` for 56 devices) and
`plan_slices` against the slices as stored, for a health change.

The HTTP requests each operation makes are counted by the API double itself (untimed).

    .venv/bin/python bench/bench_dra_slices.py [--rounds 250] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dra_api_double import ApiDouble
from lightkube.resources.core_v1 import Node

from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.cli.logsetup import formatter
from gpuslice.core.config import parse_config
from gpuslice.core.dra.publish import plan_slices
from gpuslice.core.sharing.plan import build_plan
from gpuslice.k8s.client import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.state import PlanState, Snapshot

DRIVER = "gpu.nvidia.com"
NODE = "bench-node"
NODE_SPEC = "sim:8xa100-80gb/mig=1g.10gb*7"
SICK_GPU = 3
XID = 79


class _Drop(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def snapshots() -> tuple[Snapshot, Snapshot]:
    """The node healthy, and with one GPU unhealthy."""
    backend = open_backend(NODE_SPEC)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    healthy = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory).current
    sick_uuid = inventory.gpus[SICK_GPU].uuid
    sick = dataclasses.replace(
        healthy, version=2, unhealthy=frozenset({sick_uuid}), last_xid={sick_uuid: XID}
    )
    return healthy, sick


async def measure(api: ApiDouble, rounds: int) -> None:
    healthy, sick = snapshots()
    client = make_client(api.kubeconfig(), trust_env=False)
    objects = DraApi(client, NODE, DRIVER)
    current = {"snap": healthy}

    def publisher() -> SlicePublisher:
        return SlicePublisher(objects, driver=DRIVER, node=NODE, snapshot=lambda: current["snap"])

    state: dict[str, Any] = {}

    async def first() -> None:
        current["snap"] = healthy
        state["pub"] = publisher()
        changes = await state["pub"].publish_once()
        assert len(changes.create) == 1, changes

    async def resync() -> None:
        changes = await state["pub"].publish_once()
        assert changes.empty, changes

    async def list_alone() -> None:
        await objects.list_slices()

    async def health() -> None:
        current["snap"] = sick
        changes = await state["pub"].publish_once()
        assert len(changes.update) == 1, changes

    async def get_node() -> None:
        await client.get(Node, NODE)

    # The pure part: the stored slices as the API returns them after a healthy publish.
    await first()
    stored = await objects.list_slices()
    pure_pub = publisher()

    async def pure() -> None:
        wanted = pure_pub.wanted_devices(sick)
        changes = plan_slices(stored, wanted, driver=DRIVER, node=NODE, node_uid="uid")
        assert len(changes.update) == 1

    def wipe() -> None:
        api.call("wipe", node=NODE, driver=DRIVER)

    Op = tuple[str, Callable[[], Awaitable[None]]]
    sequence: list[Op] = [
        ("first publish (create)", first),
        ("no-change resync", resync),
        ("list slices alone (ref.)", list_alone),
        ("health change (republish)", health),
    ]
    blocks: list[list[Op]] = [
        [("GET Node (baseline)", get_node)],
        [("pure: wanted devices + plan", pure)],
        sequence,
    ]
    for _ in range(max(10, rounds // 10)):
        for block in blocks:
            if block is sequence:
                wipe()
            for _, op in block:
                await op()
    samples: dict[str, list[float]] = {name: [] for block in blocks for name, _ in block}
    for i in range(rounds):
        shift = i % len(blocks)
        for block in blocks[shift:] + blocks[:shift]:
            if block is sequence:
                wipe()
            for name, op in block:
                start = time.perf_counter()
                await op()
                samples[name].append(time.perf_counter() - start)

    # Requests per operation and what the API holds after each (counted there, untimed).
    wipe()
    counts: dict[str, list[str]] = {}
    for name, op in [("GET Node (baseline)", get_node), *sequence]:
        before = api.call("count")["count"]
        await op()
        counts[name] = api.call("requests", since=before)["requests"]
    after = api.call("slices", node=NODE, driver=DRIVER)["slices"]
    await client.close()

    base = samples["GET Node (baseline)"]
    b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
    devices = sum(s[2] for s in after)
    print(
        f"{rounds} interleaved rounds; {NODE_SPEC}: {devices} devices in {len(after)} slice(s) "
        f"(after the health change: generation {after[0][1]}, {after[0][3]} tainted); "
        f"API double in a child process; {os.cpu_count()} CPUs"
    )
    print(f"{'operation':30} {'p50 ms':>8} {'p99 ms':>8} {'p50 x':>7} {'p99 x':>7} {'HTTP':>5}")
    for name, s in samples.items():
        p50, p99 = percentile(s, 0.5), percentile(s, 0.99)
        http = len(counts[name]) if name in counts else ""
        print(
            f"{name:30} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {p50 / b50:7.2f} {p99 / b99:7.2f} "
            f"{http!s:>5}"
        )
    for name, reqs in counts.items():
        print(f"  {name}: {', '.join(reqs)}")

    def x50(name: str) -> str:
        return f"{percentile(samples[name], 0.5) / b50:.2f}x ({len(counts.get(name, []))} HTTP)"

    print(
        f"Closing note: against one GET of the Node at p50, the first publish costs "
        f"{x50('first publish (create)')}, a no-change resync {x50('no-change resync')}, a "
        f"health change {x50('health change (republish)')}; the pure part "
        f"{percentile(samples['pure: wanted devices + plan'], 0.5) / b50:.2f}x."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=250)
    parser.add_argument("--quick", action="store_true", help="40 rounds")
    args = parser.parse_args()
    handler = _Drop()
    handler.setFormatter(formatter("text"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    with ApiDouble() as api:
        api.call("node", name=NODE)
        asyncio.run(measure(api, 40 if args.quick else args.rounds))


if __name__ == "__main__":
    main()
