#!/usr/bin/env python3
"""Allocate and ListAndWatch latency through real unix sockets, as ratios to an empty call.

Absolute gRPC latencies depend on the machine; what the plugin controls is how much it adds
on top of gRPC itself. So every number here is set against an empty grpc.aio unary call
(Empty in, Empty out, same (de)serializer style as the plugin) served by the same process,
over the same kind of socket, measured in the same run with the calls interleaved (one
baseline, one Allocate on the small plan, one on the large plan, rotating which goes first),
so drift and noise from other work on the machine hit all three alike.

What runs: the real `DevicePluginManager` (kubelet_socket=None, so nothing registers) serving
two plans built by the real builder (`build_plan` on `parse_config` output for the simulated
nodes `sim:2xa100-40gb` with 4 time-slicing replicas and `sim:8xa100-40gb` with 1024, i.e.
8,192 devices), logging at INFO through a handler that formats every record and drops it, so
the per-call log line's cost stays in as in production. The client is
`gpuslice.kubelet.rpc.DevicePluginClient`, the same typed client the kubelet emulator uses.

Where it runs: by default the servers live in a child process (this script with `--serve`)
and the client here, so each has its own interpreter, GIL and event loop. On a 2-core machine
that is the honest arrangement: the kubelet is another process, and in one loop the client's
own work (building requests, decoding 8,192-device lists) would queue in front of the
server's and be charged to it. `--in-process` runs both in one loop for comparison and says
so in the output.

ListAndWatch: time from opening a stream to holding the decoded first response. "cold" bumps
the plan version first (same plan), so the server must rebuild and encode the list; "warm"
reuses the encoded bytes of the current version. Before each measurement the script waits
until the server has closed every earlier stream (counted from the servicer's own open/close
log lines), so a stream still winding down cannot encode the list ahead of the measured one.
The concurrency lines open N streams on N separate connections at once and read raw bytes
(no client-side decoding, which would otherwise dominate on the client's single core); if
the list were encoded per stream, N cold streams would cost about N times one. The fan-out
line times a health change (one GPU unhealthy or healthy again) from the publish call until
every open stream has the new list.

    .venv/bin/python bench/bench_allocate.py [--rounds 3000] [--streams 20] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from google.protobuf.internal import api_implementation

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import Plan
from gpuslice.core.sharing.plan import build_plan
from gpuslice.kubelet.manager import DevicePluginManager
from gpuslice.kubelet.rpc import LIST_AND_WATCH, DevicePluginClient, unix_target
from gpuslice.logs import get_logger
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.state import PlanState

RESOURCE = "nvidia.com/gpu"
SMALL = ("sim:2xa100-40gb", 4)
LARGE = ("sim:8xa100-40gb", 1024)
BASELINE_SERVICE, BASELINE_METHOD = "gpuslice.bench.Baseline", "Empty"
CONTROL_SERVICE = "gpuslice.bench.Control"
QUIESCE = f"/{CONTROL_SERVICE}/Quiesce"
PUBLISH = f"/{CONTROL_SERVICE}/Publish"
CALL_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
SCRIPT = Path(__file__).resolve()


# -- server side -------------------------------------------------------------------------


def time_slicing_plan(node_spec: str, replicas: int) -> tuple[Plan, Inventory]:
    backend = open_backend(node_spec)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    config = parse_config(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: {RESOURCE}\n      replicas: {replicas}\n"
    )
    return build_plan(inventory, config), inventory


class DiscardingCounter(logging.Handler):
    """Formats every record (a real handler's cost), keeps none, counts ListAndWatch streams."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        self.opened = 0
        self.closed = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        if "event=list-and-watch-open" in text:
            self.opened += 1
        elif "event=list-and-watch-closed" in text:
            self.closed += 1


@dataclass(frozen=True, slots=True)
class Endpoints:
    baseline: str
    control: str
    small: str
    large: str


async def _empty(request: api.Empty, context: grpc.aio.ServicerContext) -> api.Empty:
    return api.Empty()


def _control_handler(state: PlanState, sick: str, streams: DiscardingCounter) -> object:
    async def quiesce(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Returns once the server has closed every ListAndWatch stream it opened."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_TIMEOUT_S
        while streams.opened != streams.closed:
            if loop.time() > deadline:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "streams still open")
            await asyncio.sleep(0.001)
        return b""

    async def publish(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """b"same": new version, same plan. b"flip": toggle one GPU's health."""
        if request == b"flip":
            state.publish(unhealthy=frozenset() if state.current.unhealthy else frozenset({sick}))
        else:
            state.publish()
        return b""

    return grpc.method_handlers_generic_handler(
        CONTROL_SERVICE,
        {
            "Quiesce": grpc.unary_unary_rpc_method_handler(quiesce),
            "Publish": grpc.unary_unary_rpc_method_handler(publish),
        },
    )


@contextlib.asynccontextmanager
async def serving(root: Path) -> AsyncIterator[Endpoints]:
    """The baseline server, a control server and one DevicePluginManager per plan."""
    streams = DiscardingCounter()
    records = logging.getLogger("gpuslice.bench.server")
    records.setLevel(logging.INFO)
    records.propagate = False
    records.addHandler(streams)
    # the managers log through the structured logger (as in the daemon); its records land
    # on the stdlib logger of the same name, so the handler above still sees every line
    log = get_logger("gpuslice.bench.server")
    small_plan, small_inv = time_slicing_plan(*SMALL)
    large_plan, large_inv = time_slicing_plan(*LARGE)
    states = {"small": PlanState(small_plan, small_inv), "large": PlanState(large_plan, large_inv)}

    baseline = grpc.aio.server()
    baseline.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                BASELINE_SERVICE,
                {
                    BASELINE_METHOD: grpc.unary_unary_rpc_method_handler(
                        _empty,
                        request_deserializer=api.Empty.FromString,
                        response_serializer=api.Empty.SerializeToString,
                    )
                },
            ),
        )
    )
    baseline.add_insecure_port(unix_target(str(root / "baseline.sock")))
    control = grpc.aio.server()
    control.add_generic_rpc_handlers(
        (_control_handler(states["large"], large_inv.gpus[0].uuid, streams),)
    )
    control.add_insecure_port(unix_target(str(root / "control.sock")))
    await baseline.start()
    await control.start()

    stop = asyncio.Event()
    managers: dict[str, DevicePluginManager] = {}
    tasks: list[asyncio.Task[None]] = []
    for name, state in states.items():
        (root / name).mkdir()
        managers[name] = DevicePluginManager(
            state, plugin_dir=root / name, kubelet_socket=None, logger=log
        )
        tasks.append(asyncio.create_task(managers[name].run(stop), name=f"bench-{name}"))
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while not all(RESOURCE in m.serving for m in managers.values()):
            if loop.time() > deadline or any(t.done() for t in tasks):
                raise RuntimeError("device plugin servers did not start")
            await asyncio.sleep(0.01)
        yield Endpoints(
            baseline=str(root / "baseline.sock"),
            control=str(root / "control.sock"),
            small=str(managers["small"].serving[RESOURCE]),
            large=str(managers["large"].serving[RESOURCE]),
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await baseline.stop(None)
        await control.stop(None)


async def serve_child(root: Path) -> None:
    """Child process: serve, print the endpoints as one JSON line, stop when stdin closes."""
    async with serving(root) as endpoints:
        sys.stdout.write(json.dumps(asdict(endpoints)) + "\n")
        sys.stdout.flush()
        await asyncio.to_thread(sys.stdin.buffer.read)


@contextlib.asynccontextmanager
async def server_process(root: Path) -> AsyncIterator[tuple[Endpoints, str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--serve",
        str(root),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
        if not line:
            raise RuntimeError("the server process exited before it was ready (see above)")
        mode = f"server in a child process (pid {proc.pid}), client in this one: separate loops"
        yield Endpoints(**json.loads(line)), mode
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def server_here(root: Path) -> AsyncIterator[tuple[Endpoints, str]]:
    async with serving(root) as endpoints:
        yield endpoints, "--in-process: server and client share THIS event loop"


# -- client side -------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class Latency:
    p50: float
    p99: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Latency:
        return cls(percentile(samples, 0.50), percentile(samples, 0.99))


Call = Callable[[], Awaitable[object]]


async def interleaved(calls: dict[str, Call], rounds: int, warmup: int) -> dict[str, Latency]:
    """Each round calls every kind once, rotating which goes first; seconds per call."""
    kinds = list(calls.items())
    for _ in range(warmup):
        for _, call in kinds:
            await call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(rounds):
        shift = i % len(kinds)
        for name, call in kinds[shift:] + kinds[:shift]:
            start = time.perf_counter()
            await call()
            samples[name].append(time.perf_counter() - start)
    return {name: Latency.of(s) for name, s in samples.items()}


async def first_list(client: DevicePluginClient) -> tuple[float, api.ListAndWatchResponse]:
    start = time.perf_counter()
    stream = client.list_and_watch()
    try:
        first = await anext(stream)
        elapsed = time.perf_counter() - start
    finally:
        await stream.aclose()
    return elapsed, first


def allocate_calls(client: DevicePluginClient, ids: Sequence[str]) -> Call:
    """One-device Allocate requests, cycling over devices spread across every GPU."""
    step = max(1, len(ids) // 61)
    requests = [
        api.AllocateRequest(
            container_requests=[
                api.ContainerAllocateRequest(devices_ids=[ids[(k * step) % len(ids)]])
            ]
        )
        for k in range(61)
    ]
    cycle = itertools.cycle(requests)

    async def call() -> object:
        return await client.allocate(next(cycle), timeout_s=CALL_TIMEOUT_S)

    return call


@dataclass(frozen=True, slots=True)
class ListResults:
    devices: int
    size: int
    cold: float
    warm: float
    decode: float
    raw_cold_1: float
    raw_warm_1: float
    raw_cold_n: float
    fanout_1: float
    fanout_n: float
    n: int


async def list_and_watch_results(
    endpoints: Endpoints, streams: int, reps: int, n: int
) -> ListResults:
    async with contextlib.AsyncExitStack() as stack:
        control = await stack.enter_async_context(
            grpc.aio.insecure_channel(unix_target(endpoints.control))
        )
        quiesce = control.unary_unary(QUIESCE)
        publish = control.unary_unary(PUBLISH)
        main = await stack.enter_async_context(
            grpc.aio.insecure_channel(unix_target(endpoints.large))
        )
        client = DevicePluginClient(main)
        channels = [
            await stack.enter_async_context(grpc.aio.insecure_channel(unix_target(endpoints.large)))
            for _ in range(n)
        ]
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), CALL_TIMEOUT_S)
        raw = [ch.unary_stream(LIST_AND_WATCH) for ch in channels]

        async def settle(bump: bool) -> None:
            await quiesce(b"", timeout=CALL_TIMEOUT_S)
            if bump:
                await publish(b"same", timeout=CALL_TIMEOUT_S)

        _, listing = await first_list(client)  # warm-up, and the connection is up
        cold, warm = [], []
        for _ in range(streams):
            await settle(True)
            cold.append((await first_list(client))[0])
            await settle(False)
            warm.append((await first_list(client))[0])
        payload = listing.SerializeToString()
        decode = []
        for _ in range(streams):
            start = time.perf_counter()
            api.ListAndWatchResponse.FromString(payload)
            decode.append(time.perf_counter() - start)

        async def raw_first(k: int) -> bytes:
            call = raw[k](b"")
            try:
                message: bytes = await call.read()
            finally:
                call.cancel()
            return message

        async def raw_all(count: int, bump: bool) -> float:
            await settle(bump)
            start = time.perf_counter()
            got = await asyncio.gather(*(raw_first(k) for k in range(count)))
            elapsed = time.perf_counter() - start
            if len(set(got)) != 1:
                raise RuntimeError("concurrent streams received different first lists")
            return elapsed

        raw_cold_1 = [await raw_all(1, True) for _ in range(reps)]
        raw_warm_1 = [await raw_all(1, False) for _ in range(reps)]
        raw_cold_n = [await raw_all(n, True) for _ in range(reps)]

        async def fanout(count: int) -> float:
            await settle(False)
            calls = [raw[k](b"") for k in range(count)]
            try:
                firsts = await asyncio.gather(*(c.read() for c in calls))
                start = time.perf_counter()
                await publish(b"flip", timeout=CALL_TIMEOUT_S)
                seconds = await asyncio.gather(*(c.read() for c in calls))
                elapsed = time.perf_counter() - start
            finally:
                for c in calls:
                    c.cancel()
            if any(a == b for a, b in zip(firsts, seconds, strict=True)):
                raise RuntimeError("a stream got no new list after the health change")
            return elapsed

        fanout_1 = [await fanout(1) for _ in range(reps)]
        fanout_n = [await fanout(n) for _ in range(reps)]
        await settle(False)
    med = statistics.median
    return ListResults(
        devices=len(listing.devices),
        size=len(payload),
        cold=med(cold),
        warm=med(warm),
        decode=med(decode),
        raw_cold_1=med(raw_cold_1),
        raw_warm_1=med(raw_warm_1),
        raw_cold_n=med(raw_cold_n),
        fanout_1=med(fanout_1),
        fanout_n=med(fanout_n),
        n=n,
    )


async def measure(args: argparse.Namespace) -> None:
    rounds, streams, reps, n = args.rounds, args.streams, args.reps, args.concurrency
    warmup = max(50, rounds // 10)
    with tempfile.TemporaryDirectory(prefix="gsb-", dir="/tmp") as tmp:
        started = time.perf_counter()
        where = server_here if args.in_process else server_process
        async with where(Path(tmp)) as (endpoints, mode):
            async with (
                grpc.aio.insecure_channel(unix_target(endpoints.baseline)) as base_ch,
                grpc.aio.insecure_channel(unix_target(endpoints.small)) as small_ch,
                grpc.aio.insecure_channel(unix_target(endpoints.large)) as large_ch,
            ):
                empty = base_ch.unary_unary(
                    f"/{BASELINE_SERVICE}/{BASELINE_METHOD}",
                    request_serializer=api.Empty.SerializeToString,
                    response_deserializer=api.Empty.FromString,
                )
                request = api.Empty()
                small, large = DevicePluginClient(small_ch), DevicePluginClient(large_ch)
                small_ids = [d.ID for d in (await first_list(small))[1].devices]
                large_ids = [d.ID for d in (await first_list(large))[1].devices]
                check = await small.allocate(
                    api.AllocateRequest(
                        container_requests=[api.ContainerAllocateRequest(devices_ids=small_ids[:1])]
                    ),
                    timeout_s=CALL_TIMEOUT_S,
                )
                if not check.container_responses[0].envs:
                    raise RuntimeError("Allocate answered with no environment: nothing measured")
                unary = await interleaved(
                    {
                        "baseline": lambda: empty(request, timeout=CALL_TIMEOUT_S),
                        "small": allocate_calls(small, small_ids),
                        "large": allocate_calls(large, large_ids),
                    },
                    rounds,
                    warmup,
                )
            lists = await list_and_watch_results(endpoints, streams, reps, n)
        total = time.perf_counter() - started
    report(args, mode, unary, lists, len(small_ids), total, warmup)


def report(
    args: argparse.Namespace,
    mode: str,
    unary: dict[str, Latency],
    lists: ListResults,
    small_devices: int,
    total_s: float,
    warmup: int,
) -> None:
    base = unary["baseline"]
    ms = 1000.0
    print(
        f"gpuslice bench_allocate: {mode}; {os.cpu_count()} CPUs; Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}, protobuf "
        f"{api_implementation.Type()}"
    )
    print(f"{args.rounds} interleaved rounds per unary kind after {warmup} warm-up rounds\n")
    print(f"{'unary call':<52}{'p50 ms':>9}{'p99 ms':>9}{'p50 x':>8}{'p99 x':>8}")
    rows = [
        ("empty grpc.aio unary (baseline)", base),
        (f"Allocate 1 device, {small_devices} advertised (2 GPUs x 4)", unary["small"]),
        (f"Allocate 1 device, {lists.devices} advertised (8 GPUs x 1024)", unary["large"]),
    ]
    for label, lat in rows:
        print(
            f"{label:<52}{lat.p50 * ms:>9.3f}{lat.p99 * ms:>9.3f}"
            f"{lat.p50 / base.p50:>8.2f}{lat.p99 / base.p99:>8.2f}"
        )
    print(
        f"\nListAndWatch, {lists.devices} devices, first response {lists.size:,} bytes "
        f"(median of {args.streams} streams; x = times the baseline p50)"
    )
    print(f"{'':<52}{'ms':>9}{'x':>9}{'us/dev':>9}")
    list_rows = [
        ("open -> decoded first list, cold (encode)", lists.cold),
        ("open -> decoded first list, warm (cached)", lists.warm),
        ("  of which client decode alone", lists.decode),
        ("open -> raw first bytes, cold, 1 stream", lists.raw_cold_1),
        ("open -> raw first bytes, warm, 1 stream", lists.raw_warm_1),
        (f"open -> raw first bytes, cold, {lists.n} streams", lists.raw_cold_n),
        ("health change -> new list on 1 open stream", lists.fanout_1),
        (f"health change -> new list on {lists.n} open streams", lists.fanout_n),
    ]
    for label, seconds in list_rows:
        print(
            f"{label:<52}{seconds * ms:>9.2f}{seconds / base.p50:>9.0f}"
            f"{seconds * 1e6 / lists.devices:>9.2f}"
        )
    encode = lists.raw_cold_1 - lists.raw_warm_1
    print(
        f"\n{lists.n} cold streams took {lists.raw_cold_n / lists.raw_cold_1:.1f}x one cold stream "
        f"(encoding once per stream would be about {lists.n}x; the encode share of one cold "
        f"stream is {encode * ms:.1f} ms)."
    )
    print(
        f"Closing note: Allocate costs {unary['small'].p50 / base.p50:.2f}x / "
        f"{unary['small'].p99 / base.p99:.2f}x an empty grpc.aio unary call (p50 / p99) with "
        f"{small_devices} devices advertised and {unary['large'].p50 / base.p50:.2f}x / "
        f"{unary['large'].p99 / base.p99:.2f}x with {lists.devices}; ListAndWatch's first "
        f"response with {lists.devices} devices costs {lists.cold / base.p50:.0f}x (cold) / "
        f"{lists.warm / base.p50:.0f}x (warm) the empty call's p50, "
        f"{lists.cold * 1e6 / lists.devices:.2f} / {lists.warm * 1e6 / lists.devices:.2f} us per "
        f"device. Whole run: {total_s:.1f} s."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3000, help="unary calls per kind")
    parser.add_argument("--streams", type=int, default=20, help="ListAndWatch cold/warm streams")
    parser.add_argument("--reps", type=int, default=10, help="repeats of each raw/fan-out line")
    parser.add_argument("--concurrency", type=int, default=16, help="streams opened at once")
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke run")
    parser.add_argument("--in-process", action="store_true", help="server in this event loop")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("rounds", "streams", "reps", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.serve is not None:
        asyncio.run(serve_child(args.serve))
        return
    if args.quick:
        args.rounds, args.streams, args.reps = min(args.rounds, 300), 5, 3
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
