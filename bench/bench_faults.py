#!/usr/bin/env python3
"""Soak figures for the fault suite, at full size, as counts and ratios.

The real `gpuslice plugin` process on `sim:8xh100-80gb` with 128 replicas per GPU (1,024
devices), driven by the kubelet emulator over unix sockets, the way `tests/faults` drives
it at a tenth of the size. Each scenario prints what happened (counts) and how long it took
relative to a baseline taken in the same run on the same daemon:

- allocate: 1,000 Allocates from 50 clients while the config flips and the kubelet restarts;
  outcomes by gRPC status, p50/p99 latency / idle Allocate p50.
- restarts: 50 kubelet restarts in a row; re-registration p50/max / the first one.
- sigkill: SIGKILL and restart over stale sockets, 5 times; all re-registered?
- xids: 1,000 XIDs within a second, then a recovery; time until the control queue drains
  and until the GPU is back / one XID's time to Unhealthy.
- scrapes: 200 concurrent scrapes of /metrics; p50/p99 / one scrape alone.
- sigterm: SIGTERM with 20 Allocates in flight; outcomes, exit code, sockets left.
- corpus: every hostile config of `gpuslice.testing.hostile_configs` through live reload;
  rejected count, devices still advertised, rejection time / a valid reload's time.
- claims (`faults_claims.py`, a DRA daemon of its own): a hung MPS start, a cancelled
  Prepare and path-hostile claim names; see that module.
- checkpoint (`faults_checkpoint.py`, a DRA daemon per entry): every corrupt checkpoint of
  `gpuslice.testing.hostile_checkpoints` at start; start-to-serving / a good start, Prepare.
- probes (`faults_probes.py`, a daemon of its own): 100 slow and 100 idle reconnecting
  clients on the HTTP endpoint; probe latency p50/p99 / an unloaded probe, probes not 200.
- lifecycle (`faults_lifecycle.py`, agents of their own per case): upgrade, checkpoint
  removed, API-less start then restart, two agents (DRA and device plugin), SIGKILL (DRA
  and device plugin) and SIGTERM under MPS clients, reboot, a restart into a config
  without MPS or with it renamed, a crash mid-Prepare, a rollback to the previous release
  after an API-less start, a lost dynamic MIG record, with claims or pods in place;
  what each lost or left behind (goal: 0), and what already holds (3,000
  Prepare/Unprepare cycles flat, a kubelet restart mid-Prepare undone). In the full run
  and under `--lifecycle` (alone); `--quick` skips it.

    PYTHONPATH=src .venv/bin/python bench/bench_faults.py [--quick] [--lifecycle]
        [--require-nothing-lost]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from faults_checkpoint import scenario_checkpoint
from faults_claims import scenario_claims
from faults_lifecycle import scenario_lifecycle
from faults_probes import scenario_probes

from gpuslice.backends.simulated.control import ControlDir
from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from gpuslice.testing.hostile_configs import HOSTILE

NODE = "sim:8xh100-80gb"
RES = "nvidia.com/gpu"
WAIT_S = 60.0
FAKE_MPS = f"{sys.executable} -m gpuslice.emulator.fake_mps_control"


def ts(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: {RES}\n      replicas: {replicas}\n"
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Node:
    def __init__(self, root: Path, metrics_port: int | None = None) -> None:
        self.root = root
        self.plugin_dir = root / "dp"
        self.plugin_dir.mkdir()
        self.config = root / "config.yaml"
        self.config.write_text(ts(128), encoding="utf-8")
        self.control = ControlDir(root / "ctl")
        self.kubelet = KubeletEmulator(self.plugin_dir)
        args = [
            "--node",
            NODE,
            "--config-file",
            str(self.config),
            "--device-plugin-path",
            str(self.plugin_dir),
            "--no-labels",
            "--no-compute-mode",
            "--mps-control",
            FAKE_MPS,
            "--config-poll-interval",
            "0.1",
        ]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port), "--metrics-interval", "1"]
        self.daemon = DaemonProcess(
            args, log_path=root / "daemon.log", env={"GPUSLICE_SIM_CONTROL_DIR": str(root / "ctl")}
        )

    def socket(self) -> str:
        return str(self.plugin_dir / "nvidia-gpu.sock")

    async def until(self, predicate: Callable[[], bool]) -> float:
        t0 = time.perf_counter()
        await self.kubelet.wait_for(predicate, WAIT_S)
        return time.perf_counter() - t0

    def write(self, text: str) -> None:
        tmp = self.config.with_name("config.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.config)


@contextlib.asynccontextmanager
async def node(metrics_port: int | None = None) -> AsyncIterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))
    n = Node(root, metrics_port)
    await n.kubelet.start()
    await n.daemon.start()
    try:
        await n.until(lambda: n.kubelet.capacity(RES) == 1024)
        yield n
    finally:
        await n.daemon.terminate()
        await n.kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def allocate_once(stub: DevicePluginClient, device: str) -> tuple[str, float]:
    request = api.AllocateRequest(
        container_requests=[api.ContainerAllocateRequest(devices_ids=[device])]
    )
    t0 = time.perf_counter()
    try:
        await stub.allocate(request, timeout_s=WAIT_S)
        status = "OK"
    except grpc.aio.AioRpcError as exc:
        status = exc.code().name
    return status, time.perf_counter() - t0


async def scenario_allocate(n: Node, total: int, clients: int) -> float:
    """Returns the p50 of the successful Allocates under churn / the idle Allocate p50."""
    ids = sorted(i for i in n.kubelet.devices(RES) if i.endswith(("::0", "::1")))
    async with grpc.aio.insecure_channel(unix_target(n.socket())) as channel:
        stub = DevicePluginClient(channel)
        idle = [(await allocate_once(stub, ids[i % len(ids)]))[1] for i in range(100)]
    base = statistics.median(idle)
    results: list[tuple[str, float]] = []
    done = asyncio.Event()

    async def client(c: int) -> None:
        async with grpc.aio.insecure_channel(unix_target(n.socket())) as channel:
            stub = DevicePluginClient(channel)
            for k in range(total // clients):
                results.append(await allocate_once(stub, ids[(c * 7 + k) % len(ids)]))

    async def churn() -> None:
        flips = restarts = 0
        for replicas in itertools.cycle([64, 128]):
            if done.is_set():
                break
            n.write(ts(replicas))
            flips += 1
            await asyncio.sleep(0.3)
            if replicas == 64:
                await n.kubelet.restart()
                restarts += 1
        print(f"  churn: {flips} config flips, {restarts} kubelet restarts during the run")

    churner = asyncio.create_task(churn())
    await asyncio.gather(*(client(c) for c in range(clients)))
    done.set()
    await churner
    lat = [t for s, t in results if s == "OK"]
    counts = Counter(s for s, _ in results)
    print(f"allocate: {len(results)} Allocates from {clients} clients: {dict(counts)}")
    if lat:
        print(
            f"  latency p50 {statistics.median(lat) / base:.1f}x, p99 {pct(lat, 0.99) / base:.1f}x "
            f"the idle Allocate p50 ({base * 1e3:.2f} ms); daemon running: {n.daemon.running}"
        )
    n.write(ts(128))
    await n.until(lambda: n.kubelet.capacity(RES) == 1024)
    return statistics.median(lat) / base if lat else float("nan")


async def scenario_restarts(n: Node, count: int) -> None:
    times = []
    for _ in range(count):
        before = n.kubelet.registrations[RES]
        await n.kubelet.restart()
        times.append(
            await n.until(
                lambda b=before: (
                    n.kubelet.registrations[RES] > b  # type: ignore[misc]
                    and n.kubelet.capacity(RES) > 0
                )
            )
        )
    one = times[0]
    print(
        f"restarts: {count} kubelet restarts, {count} re-registrations; p50 "
        f"{statistics.median(times) / one:.2f}x, max {max(times) / one:.2f}x the first "
        f"({one * 1e3:.0f} ms)"
    )


async def scenario_sigkill(n: Node, rounds: int) -> None:
    ok = 0
    times = []
    for _ in range(rounds):
        assert n.daemon.proc is not None
        n.daemon.proc.kill()
        await n.daemon.proc.wait()
        stale = (n.plugin_dir / "nvidia-gpu.sock").exists()
        before = n.kubelet.registrations[RES]
        t0 = time.perf_counter()
        await n.daemon.start()
        await n.until(lambda b=before: n.kubelet.registrations[RES] > b)  # type: ignore[misc]
        await n.until(lambda: n.kubelet.capacity(RES) == 1024)
        times.append(time.perf_counter() - t0)
        ok += stale and n.kubelet.capacity(RES) == 1024
    print(
        f"sigkill: {rounds} SIGKILLs over stale sockets, {ok} restarted and re-registered "
        f"1,024 devices; restart-to-registered p50 {statistics.median(times):.2f} s "
        f"(a process start)"
    )


async def scenario_xids(n: Node, count: int) -> None:
    n.control.inject_xid(3, 79)
    one = await n.until(lambda: n.kubelet.allocatable(RES) == 1024 - 128)
    n.control.inject_recovery(3)
    await n.until(lambda: n.kubelet.allocatable(RES) == 1024)
    t0 = time.perf_counter()
    for i in range(count - 1):  # GPU 0 falls off the bus; the rest are ignored XID 13s
        n.control.inject_xid(i % 8, 79 if i % 8 == 0 else 13)
    n.control.inject_xid(1, 79)  # the last one: once GPU 1 is Unhealthy, all were applied
    sent = time.perf_counter() - t0
    applied = await n.until(lambda: n.kubelet.allocatable(RES) == 1024 - 256)
    n.control.inject_recovery(0)
    n.control.inject_recovery(1)
    back = await n.until(lambda: n.kubelet.allocatable(RES) == 1024)
    print(
        f"xids: {count} XIDs sent in {sent:.2f} s; all applied (GPUs 0 and 1 Unhealthy, 256 "
        f"devices) {applied / one:.1f}x one XID's time to Unhealthy ({one * 1e3:.0f} ms) after "
        f"the last was sent; recovered in {back / one:.1f}x; daemon running: {n.daemon.running}"
    )


async def scenario_scrapes(port: int, count: int) -> None:
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> float:
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
        return time.perf_counter() - t0

    for _ in range(50):
        with contextlib.suppress(OSError):
            scrape()
            break
        await asyncio.sleep(0.2)
    alone = statistics.median([await asyncio.to_thread(scrape) for _ in range(20)])
    errors = 0

    def guarded() -> float:
        nonlocal errors
        try:
            return scrape()
        except OSError:
            errors += 1
            return float("nan")

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(count) as pool:
        times = await asyncio.gather(*(loop.run_in_executor(pool, guarded) for _ in range(count)))
    ok = [t for t in times if t == t]
    print(
        f"scrapes: {count} concurrent, {errors} failed; p50 {statistics.median(ok) / alone:.1f}x, "
        f"p99 {pct(ok, 0.99) / alone:.1f}x one scrape alone ({alone * 1e3:.1f} ms)"
    )


async def scenario_sigterm(n: Node, inflight: int) -> None:
    ids = sorted(n.kubelet.devices(RES))
    async with grpc.aio.insecure_channel(unix_target(n.socket())) as channel:
        stub = DevicePluginClient(channel)
        await stub.get_device_plugin_options(timeout_s=WAIT_S)
        calls = [asyncio.create_task(allocate_once(stub, ids[i])) for i in range(inflight)]
        await asyncio.sleep(0)
        assert n.daemon.proc is not None
        n.daemon.proc.send_signal(signal.SIGTERM)
        outcomes = Counter(s for s, _ in await asyncio.gather(*calls))
    code = await n.daemon.wait_exit(WAIT_S)
    left = [p.name for p in n.plugin_dir.iterdir() if p.name != "kubelet.sock" and p.is_socket()]
    print(
        f"sigterm: {inflight} Allocates in flight: {dict(outcomes)}; exit {code}; "
        f"sockets left: {len(left)}"
    )


async def scenario_corpus(n: Node) -> tuple[int, float]:
    """Returns the configs rejected with the daemon up and every device kept, and the
    slowest rejection / a valid reload."""
    n.write(ts(64))
    good = await n.until(lambda: n.kubelet.capacity(RES) == 512)
    rejected = kept = intact = 0
    worst = 0.0
    for _name, put in HOSTILE.items():
        before = n.daemon.log().count("event=config-rejected")
        t0 = time.perf_counter()
        put(n.config)
        await n.kubelet.wait_for(
            lambda b=before: (
                n.daemon.log().count("event=config-rejected") > b  # type: ignore[misc]
                or not n.daemon.running
            ),
            WAIT_S,
        )
        worst = max(worst, time.perf_counter() - t0)
        up, full = n.daemon.running, n.kubelet.capacity(RES) == 512
        rejected += up
        kept += full
        intact += up and full
    print(
        f"corpus: {len(HOSTILE)} hostile configs through live reload: {rejected} rejected with "
        f"the daemon up, {kept} with all 512 devices still advertised; slowest rejection "
        f"{worst / good:.1f}x a valid reload ({good * 1e3:.0f} ms, both incl. the settle check)"
    )
    if n.config.is_dir() and not n.config.is_symlink():
        shutil.rmtree(n.config)
    n.write(ts(128))
    await n.until(lambda: n.kubelet.capacity(RES) == 1024)
    return intact, worst / good


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of each count")
    parser.add_argument(
        "--lifecycle",
        action="store_true",
        help="only the lifecycle cases (faults_lifecycle.py); with --quick, 300 soak cycles",
    )
    parser.add_argument(
        "--require-nothing-lost",
        action="store_true",
        help="exit 1 when a lifecycle case lost anything or what held no longer does",
    )
    args = parser.parse_args()
    q = args.quick
    if args.lifecycle:
        summary, clean = await scenario_lifecycle(q)
        print(f"Closing note: {summary}.")
        if args.require_nothing_lost and not clean:
            raise SystemExit(1)
        return
    scale = 10 if q else 1
    port = free_port()
    async with node(metrics_port=port) as n:
        allocate_x = await scenario_allocate(n, 1000 // scale, 50 // scale)
        await scenario_restarts(n, 50 // scale)
        await scenario_xids(n, 1000 // scale)
        await scenario_scrapes(port, 200 // scale)
        refused, corpus_x = await scenario_corpus(n)
        await scenario_sigkill(n, 5 if not q else 1)
    async with node() as n:
        await scenario_sigterm(n, 20)
    await scenario_claims(q)
    checkpoints = await scenario_checkpoint(q)
    probes = await scenario_probes(q)
    # the lifecycle cases take about two minutes even at their smallest (every case starts
    # agents, MPS daemons and an API double of its own), too long for the smoke run
    lifecycle, clean = ("lifecycle cases skipped (--quick; run --lifecycle)", True)
    if not q:
        lifecycle, clean = await scenario_lifecycle(q)
    print(
        f"Closing note: Allocates under config flips and kubelet restarts took {allocate_x:.1f}x "
        f"an idle Allocate at p50; {refused} of {len(HOSTILE)} hostile configs were rejected "
        f"with every device kept, the slowest in {corpus_x:.1f}x a valid reload; "
        f"{checkpoints}; {probes}; {lifecycle}."
    )
    if args.require_nothing_lost and not clean:
        raise SystemExit(1)


if __name__ == "__main__":
    asyncio.run(main())
