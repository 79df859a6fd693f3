#!/usr/bin/env python3
"""NodePrepareResources / NodeUnprepareResources through the real DRA driver, as ratios.

`bench_dra_prepare.py` measures the gRPC layer with a preparer that answers at once; this
one puts the real `DraDriver` behind the same `DraServicer` handlers: the claim read from
the API through `DraApi` and lightkube, the core's decision (`claim_work`), the overlap
check, the checkpoint written twice (PrepareStarted, PrepareCompleted: atomic replace with
fsync) and the claim's CDI spec written (YAML, atomic replace with fsync). Every number is
set against an empty grpc.aio unary call served by the same server on the same socket,
measured in the same run with the calls interleaved, so noise hits all alike.

What runs, in three processes:
- the Kubernetes API double (`gpuslice.testing.apiserver`, via `dra_api_double.py`) in its
  own process, as a real API server is another machine: its request handling does not
  compete for the driver's GIL;
- the server (this script with `--serve DIR`): the real `DraServicer` handlers (v1 and
  v1beta1), the baseline method, and one `DraDriver` on the simulated node
  `sim:8xh100-80gb` (snapshot = inventory + `build_plan` with the default config, as
  `agent/dra_front.py` wires it), checkpoint and CDI specs in a temporary directory (`--dir`:
  on the same disk as /tmp by default; the output names its filesystem, since each write is
  fsynced). Claims in namespace `mem` are read from an in-memory `DraStore` instead of the
  API, to separate the API read from the driver's own work. Logs at INFO through the
  daemon's text formatter into a handler that drops the line (httpx's request lines
  included, as in production);
- the client here: the kubelet emulator's typed `DraClientV1`.

The node holds 6 other prepared claims throughout (gpu-2..gpu-7, so the checkpoint is not
empty). Each round, in rotating order: the empty call; one `DraApi.get_claim` behind a
unary call (reference: what one API read costs on this machine); and two cycles on one
exclusive GPU each, one with the claim in the API double (gpu-0), one in memory (gpu-1):
fresh Prepare, repeated Prepare (the kubelet after its restart: answered from the
record), Unprepare. Time-slicing intervals (nvidia-smi) and MPS (a control daemon) are not
measured here.

    .venv/bin/python bench/bench_dra_driver.py [--rounds 600] [--quick] [--dir PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from dra_api_double import ApiDouble

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.backends import open_backend
from gpuslice.cli.logsetup import formatter
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.plan import build_plan
from gpuslice.dra.convert import claims_to_v1
from gpuslice.dra.rpc import DraClientV1, dra_handlers, unix_target
from gpuslice.dra.servicer import DraServicer
from gpuslice.emulator.dra_store import DraStore
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile, boot_id
from gpuslice.k8s.client import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.logs import get_logger
from gpuslice.ports import SliceEvent, SliceListing
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.state import PlanState, Snapshot

SERVICE = "gpuslice.bench.Baseline"
BASELINE = f"/{SERVICE}/Empty"
GET_CLAIM = f"/{SERVICE}/GetClaim"
SOCKET = "dra.sock"
DRIVER = "gpu.nvidia.com"
NODE = "bench-node"
NODE_SPEC = "sim:8xh100-80gb"
MEM = "mem"
"""Claims in this namespace are read from the in-memory store, not the API."""
API_CLAIM = ("default", "bench-api", "gpu-0")
MEM_CLAIM = (MEM, "bench-mem", "gpu-1")
HELD = [(MEM, f"held-{i}", f"gpu-{i}") for i in range(2, 8)]


def claim_obj(namespace: str, name: str) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
    }


def allocated(name: str, device: str) -> Json:
    """The status the scheduler writes: one exclusive GPU, reserved for one pod."""
    return {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}],
                "config": [],
            }
        },
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"pod-{name}"}],
    }


# -- server side -------------------------------------------------------------------------


class _Drop(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


class Routed:
    """`ports.DraObjects`: claims in namespace `mem` from the store, the rest from the API."""

    def __init__(self, api: DraApi, store: DraStore) -> None:
        self._api = api
        self._store = store

    async def list_claims(self, uids: Collection[str] | None = None) -> list[Json]:
        return [*await self._api.list_claims(uids), *await self._store.list_claims(uids)]

    async def get_claim(self, namespace: str, name: str) -> Json:
        if namespace == MEM:
            return await self._store.get_claim(namespace, name)
        return await self._api.get_claim(namespace, name)

    async def node_uid(self) -> str:
        return await self._api.node_uid()

    async def list_slices(self) -> list[Json]:
        return await self._api.list_slices()

    async def listed_slices(self) -> SliceListing:
        return await self._api.listed_slices()

    def watch_slices(self, resource_version: str) -> AsyncIterator[SliceEvent]:
        return self._api.watch_slices(resource_version)

    async def create_slice(self, obj: Json) -> Json:
        return await self._api.create_slice(obj)

    async def replace_slice(self, obj: Json) -> Json:
        return await self._api.replace_slice(obj)

    async def delete_slice(self, name: str) -> None:
        await self._api.delete_slice(name)


def node_snapshot(spec: str) -> Snapshot:
    backend = open_backend(spec)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    return PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory).current


async def serve(root: Path, state_dir: Path, kubeconfig: Json) -> None:
    handler = _Drop()
    handler.setFormatter(formatter("text"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("grpc").setLevel(logging.WARNING)

    snap = node_snapshot(NODE_SPEC)
    client = make_client(kubeconfig, trust_env=False)
    api = DraApi(client, NODE, DRIVER)
    store = DraStore(NODE, DRIVER)
    uids: dict[str, str] = {}
    for namespace, name, device in [MEM_CLAIM, *HELD]:
        created = store.add_claim(claim_obj(namespace, name))
        store.set_claim_status(namespace, name, allocated(name, device))
        uids[name] = created["metadata"]["uid"]
    driver = DraDriver(
        DriverSettings(driver=DRIVER, node=NODE, mps_root=str(state_dir / "mps")),
        objects=Routed(api, store),
        checkpoint=CheckpointFile(state_dir / "checkpoint.json"),
        cdi=CdiSpecStore(state_dir / "cdi", CDI_KIND),
        snapshot=lambda: snap,
        boot_id=boot_id(),
    )
    await driver.load()

    async def empty(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def get_claim(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await api.get_claim(API_CLAIM[0], API_CLAIM[1])
        return b""

    baseline = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=bytes, response_serializer=bytes
            )
            for name, fn in (("Empty", empty), ("GetClaim", get_claim))
        },
    )
    servicer = DraServicer(driver, logger=get_logger("gpuslice.dra"))
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((*dra_handlers(servicer), baseline))
    server.add_insecure_port(unix_target(str(root / SOCKET)))
    await server.start()
    print(json.dumps({"uids": uids}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)
    await client.close()


# -- client side -------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def filesystem_of(path: Path) -> str:
    """The mount's filesystem type (the checkpoint's fsync cost depends on it)."""
    best, kind = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], fields[2]
    return f"{kind} ({best})"


Call = Callable[[], Awaitable[Any]]
Step = tuple[str, Call, Callable[[Any], None]]


def no_error(uid: str) -> Callable[[Any], None]:
    def check(resp: Any) -> None:
        error = resp.claims[uid].error
        if error:
            raise SystemExit(f"claim {uid}: {error}")

    return check


def _ok(_resp: Any) -> None:
    return None


async def interleaved(blocks: list[list[Step]], rounds: int) -> dict[str, list[float]]:
    """Each round runs every block once, rotating which block goes first; the steps of a
    block run in order (a repeated Prepare needs the first one before it)."""
    for _ in range(max(20, rounds // 10)):
        for block in blocks:
            for _, call, check in block:
                check(await call())
    samples: dict[str, list[float]] = {name: [] for block in blocks for name, _, _ in block}
    for i in range(rounds):
        shift = i % len(blocks)
        for block in blocks[shift:] + blocks[:shift]:
            for name, call, check in block:
                start = time.perf_counter()
                resp = await call()
                samples[name].append(time.perf_counter() - start)
                check(resp)
    return samples


async def measure(root: Path, uids: Mapping[str, str], api: ApiDouble, rounds: int) -> None:
    api_ref = ClaimRef(API_CLAIM[0], uids[API_CLAIM[1]], API_CLAIM[1])
    mem_ref = ClaimRef(MEM_CLAIM[0], uids[MEM_CLAIM[1]], MEM_CLAIM[1])
    held = [ClaimRef(ns, uids[name], name) for ns, name, _ in HELD]
    async with grpc.aio.insecure_channel(unix_target(str(root / SOCKET))) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        client = DraClientV1(channel)
        empty = channel.unary_unary(BASELINE, request_serializer=bytes, response_deserializer=bytes)
        get = channel.unary_unary(GET_CLAIM, request_serializer=bytes, response_deserializer=bytes)

        def prepare(ref: ClaimRef) -> Call:
            request = v1.NodePrepareResourcesRequest(claims=claims_to_v1([ref]))
            return lambda: client.prepare(request, timeout_s=10)

        def unprepare(ref: ClaimRef) -> Call:
            request = v1.NodeUnprepareResourcesRequest(claims=claims_to_v1([ref]))
            return lambda: client.unprepare(request, timeout_s=10)

        resp = await client.prepare(
            v1.NodePrepareResourcesRequest(claims=claims_to_v1(held)), timeout_s=10
        )
        for ref in held:
            no_error(ref.uid)(resp)

        def cycle(label: str, ref: ClaimRef) -> list[Step]:
            return [
                (f"Prepare, fresh claim ({label})", prepare(ref), no_error(ref.uid)),
                (f"Prepare, repeated ({label})", prepare(ref), no_error(ref.uid)),
                (f"Unprepare ({label})", unprepare(ref), no_error(ref.uid)),
            ]

        blocks: list[list[Step]] = [
            [("empty unary (baseline)", lambda: empty(b"", timeout=10), _ok)],
            [("empty unary + 1 API GET (ref.)", lambda: get(b"", timeout=10), _ok)],
            cycle("API", api_ref),
            cycle("in-memory store", mem_ref),
        ]
        samples = await interleaved(blocks, rounds)

        # HTTP requests each call makes to the API double (counted there, untimed).
        requests: dict[str, int] = {}
        for name, call, check in blocks[2]:
            before = api.call("count")["count"]
            check(await call())
            requests[name] = api.call("count")["count"] - before

    base = samples["empty unary (baseline)"]
    b50, b99 = percentile(base, 0.5), percentile(base, 0.99)
    print(
        f"{rounds} interleaved rounds; {NODE_SPEC}, 6 other claims held; server in a child "
        "process, API double in another, client here"
    )
    print(f"checkpoint + CDI specs on {filesystem_of(root)}; {os.cpu_count()} CPUs")
    print(f"{'call':38} {'p50 ms':>8} {'p99 ms':>8} {'p50 x':>7} {'p99 x':>7} {'HTTP':>5}")
    for name, s in samples.items():
        p50, p99 = percentile(s, 0.5), percentile(s, 0.99)
        http = requests.get(name, "")
        print(
            f"{name:38} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {p50 / b50:7.2f} {p99 / b99:7.2f} "
            f"{http!s:>5}"
        )
    fresh_api = percentile(samples["Prepare, fresh claim (API)"], 0.5)
    fresh_mem = percentile(samples["Prepare, fresh claim (in-memory store)"], 0.5)
    get50 = percentile(samples["empty unary + 1 API GET (ref.)"], 0.5)
    print(
        f"fresh Prepare p50: API - in-memory = {(fresh_api - fresh_mem) * 1e3:.3f} ms; "
        f"one API GET alone (ref. - baseline) = {(get50 - b50) * 1e3:.3f} ms"
    )

    def x50(name: str) -> str:
        return f"{percentile(samples[name], 0.5) / b50:.2f}x"

    print(
        "Closing note: through the real driver, a fresh Prepare costs "
        f"{x50('Prepare, fresh claim (API)')} an empty unary call at p50 with the claim read "
        f"from the API ({x50('empty unary + 1 API GET (ref.)')} for the call and one GET "
        f"alone) and {x50('Prepare, fresh claim (in-memory store)')} from memory; a repeated "
        f"Prepare {x50('Prepare, repeated (in-memory store)')}, an Unprepare "
        f"{x50('Unprepare (in-memory store)')}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="100 rounds")
    parser.add_argument(
        "--dir", type=Path, default=Path("/tmp"), help="where the temporary directory goes"
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.serve / "state", json.loads(args.kubeconfig)))
        return
    rounds = 100 if args.quick else args.rounds
    with (
        ApiDouble() as api,
        tempfile.TemporaryDirectory(prefix="gs-bench-", dir=args.dir) as tmp,
    ):
        api.call("node", name=NODE)
        namespace, name, device = API_CLAIM
        api_uid = api.call("claim", obj=claim_obj(namespace, name), status=allocated(name, device))
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                tmp,
                "--kubeconfig",
                json.dumps(api.kubeconfig()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise SystemExit("the server process did not start")
            uids = dict(json.loads(line)["uids"])
            uids[name] = api_uid["uid"]
            asyncio.run(measure(Path(tmp), uids, api, rounds))
        finally:
            with contextlib.suppress(BrokenPipeError):
                assert child.stdin is not None
                child.stdin.close()
            child.wait(10)


if __name__ == "__main__":
    main()
