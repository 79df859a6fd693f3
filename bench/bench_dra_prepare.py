#!/usr/bin/env python3
"""NodePrepareResources / NodeUnprepareResources through a real unix socket, as ratios.

What the DRA gRPC layer adds on top of gRPC itself: the request checks, the per-claim
contract, v1 conversion and the structured log line. Every number is set against an empty
grpc.aio unary call served by the same server on the same socket, measured in the same run
with the calls interleaved (rotating which goes first), so noise hits all alike.

What runs: a child process (this script with `--serve DIR`) serves the real `DraServicer`
handlers (`gpuslice.dra.rpc.dra_handlers`, both API versions) and the baseline method on one
socket, with an in-memory preparer that answers at once (one device, one CDI ID per claim),
so the layer's own cost is measured, not a driver's. Logs at INFO go through a handler that
formats every record and drops it, as in production. The client is the kubelet emulator's
typed `DraClientV1`. Calls: a 1-claim and a 4-claim prepare, a 1-claim unprepare.

    .venv/bin/python bench/bench_dra_prepare.py [--rounds 2000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import grpc

from gpuslice.core.dra.kubelet_api import ClaimRef, PreparedDevice, PrepareResult
from gpuslice.dra.convert import claims_to_v1
from gpuslice.dra.rpc import DraClientV1, dra_handlers, unix_target
from gpuslice.dra.servicer import DraServicer
from gpuslice.logs import get_logger
from gpuslice.protos.dra.v1 import api_pb2 as v1

BASELINE = "/gpuslice.bench.Baseline/Empty"
SOCKET = "dra.sock"
BASELINE_NAME = "empty unary (baseline)"


class InstantPreparer:
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return {
            c.uid: PrepareResult(
                devices=(
                    PreparedDevice(("gpu",), "node", "gpu-0", (f"k8s.gpuslice.io/claim={c.uid}",)),
                )
            )
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {c.uid: "" for c in claims}


class _Drop(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


async def serve(root: Path) -> None:
    logging.basicConfig(level=logging.INFO, handlers=[_Drop()])

    async def empty(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    baseline = grpc.method_handlers_generic_handler(
        "gpuslice.bench.Baseline",
        {
            "Empty": grpc.unary_unary_rpc_method_handler(
                empty, request_deserializer=bytes, response_serializer=bytes
            )
        },
    )
    servicer = DraServicer(InstantPreparer(), logger=get_logger("gpuslice.dra"))
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((*dra_handlers(servicer), baseline))
    server.add_insecure_port(unix_target(str(root / SOCKET)))
    await server.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


Call = Callable[[], Awaitable[object]]


async def interleaved(calls: dict[str, Call], rounds: int) -> dict[str, list[float]]:
    kinds = list(calls.items())
    for _ in range(max(50, rounds // 10)):
        for _, call in kinds:
            await call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(rounds):
        shift = i % len(kinds)
        for name, call in kinds[shift:] + kinds[:shift]:
            start = time.perf_counter()
            await call()
            samples[name].append(time.perf_counter() - start)
    return samples


async def measure(root: Path, rounds: int) -> None:
    claims1 = claims_to_v1([ClaimRef("default", "uid-0", "claim-0")])
    claims4 = claims_to_v1([ClaimRef("default", f"uid-{i}", f"claim-{i}") for i in range(4)])
    async with grpc.aio.insecure_channel(unix_target(str(root / SOCKET))) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        client = DraClientV1(channel)
        empty = channel.unary_unary(BASELINE, request_serializer=bytes, response_deserializer=bytes)
        calls: dict[str, Call] = {
            BASELINE_NAME: lambda: empty(b"", timeout=10),
            "NodePrepareResources, 1 claim": lambda: client.prepare(
                v1.NodePrepareResourcesRequest(claims=claims1), timeout_s=10
            ),
            "NodePrepareResources, 4 claims": lambda: client.prepare(
                v1.NodePrepareResourcesRequest(claims=claims4), timeout_s=10
            ),
            "NodeUnprepareResources, 1 claim": lambda: client.unprepare(
                v1.NodeUnprepareResourcesRequest(claims=claims1), timeout_s=10
            ),
        }
        samples = await interleaved(calls, rounds)
    base = samples[BASELINE_NAME]
    b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
    print(f"{rounds} interleaved rounds; server in a child process, client here")
    print(f"{'call':34} {'p50 ms':>8} {'p99 ms':>8} {'p50 x':>7} {'p99 x':>7}")
    for name, s in samples.items():
        p50, p99 = percentile(s, 0.5), percentile(s, 0.99)
        print(f"{name:34} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {p50 / b50:7.2f} {p99 / b99:7.2f}")
    x50 = [percentile(s, 0.5) / b50 for name, s in samples.items() if name != BASELINE_NAME]
    x99 = [percentile(s, 0.99) / b99 for name, s in samples.items() if name != BASELINE_NAME]
    print(
        "Closing note: NodePrepareResources (1 claim, 4 claims) and NodeUnprepareResources "
        "cost " + " / ".join(f"{a:.2f}x" for a in x50) + " an empty unary call on the same "
        "socket at p50, " + " / ".join(f"{a:.2f}x" for a in x99) + " at p99."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="300 rounds")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve))
        return
    rounds = 300 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="gs-bench-", dir="/tmp") as tmp:
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", tmp],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("the server process did not start")
            asyncio.run(measure(Path(tmp), rounds))
        finally:
            with contextlib.suppress(BrokenPipeError):
                assert child.stdin is not None
                child.stdin.close()
            child.wait(10)


if __name__ == "__main__":
    main()
