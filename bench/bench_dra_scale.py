"""Many DRA nodes, one real API server: what gpuslice's DRA mode costs the control plane.

A real etcd, kube-apiserver and kube-scheduler 1.36.2 (`gpuslice.testing.envtest`, binaries
from `KUBEBUILDER_ASSETS`) and N simulated nodes (default 100), each with 8 H100s shared two
ways by time-slicing (one ResourceSlice of 8 devices per node). The agents run as asyncio
tasks in a few worker processes (`--workers`), each agent with its own API connection, its
real `SlicePublisher` and `DraDriver`, as the DaemonSet's pods would.

Phases, in one run, each figure read from the server's own `apiserver_request_total` and
the processes' `/proc` counters:

1. **empty**: the nodes exist, no agent runs: the API server's CPU at rest with nothing to
   serve (the baseline of the CPU figures).
2. **poll**: the agents as they were before watching: every agent LISTs its slices each
   `--resync` seconds (10, the old `--dra-resync-interval` default). The request baseline.
3. **watch**: the agents as they are: one LIST each, then a watch. Time until every node's
   slices are published (after all slices were deleted), then `--rest` seconds at rest.
4. **wipe**: all slices of a few nodes deleted at once, as the kubelet does at its start;
   the time until each node's slice is back.
5. **claims**: `--claims` (1,000) claims and their pods; the real scheduler allocates them
   from the published slices, and each node's agent prepares the claims allocated to it (a
   worker watches claims and hands them to the right driver, as that node's kubelet would).
   Time until all are prepared, and the requests per node per minute meanwhile.

    KUBEBUILDER_ASSETS=DIR .venv/bin/python bench/bench_dra_scale.py [--nodes 100]
        [--workers 4] [--rest 60] [--watch-rest 600] [--claims 1000] [--quick]

`--quick` (4 nodes, 3 s phases, 16 claims) is the smoke run CI does: its figures say the
script works, nothing more. Without `KUBEBUILDER_ASSETS` it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest

DRIVER = "gpu.nvidia.com"
NAMESPACE = "bench"
SIM = "sim:8xh100-80gb"
CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n"
)
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ]
    },
}
TICK = os.sysconf("SC_CLK_TCK")


# -- the worker: agents for a range of nodes ------------------------------------------------


async def worker(kubeconfig: str, nodes: list[str], mode: str, resync_s: float) -> None:
    """Run one agent per node; print `published <node> <unix time>` when its slices are
    first published and `prepared <claim uid> <unix time>` per claim; exit on stdin EOF."""
    from lightkube import ALL_NS
    from lightkube.resources.resource_v1 import ResourceClaim

    from gpuslice.agent.dra_driver import DraDriver, DriverSettings
    from gpuslice.agent.dra_slices import SlicePublisher
    from gpuslice.backends import open_backend
    from gpuslice.core.config import parse_config
    from gpuslice.core.dra.cdispec import CDI_KIND
    from gpuslice.core.dra.kubelet_api import ClaimRef
    from gpuslice.core.sharing.plan import build_plan
    from gpuslice.host.cdi_store import CdiSpecStore
    from gpuslice.host.checkpoint_file import CheckpointFile
    from gpuslice.k8s import make_client
    from gpuslice.k8s.dra import DraApi
    from gpuslice.state import PlanState

    backend = open_backend(SIM, environ={})
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    plan = build_plan(inventory, parse_config(CONFIG))
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    clients = []
    drivers: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="gs-scale-"))

    async def agent(node: str) -> None:
        client = make_client(Path(kubeconfig), trust_env=False)
        clients.append(client)
        state = PlanState(plan, inventory)
        api = DraApi(client, node, DRIVER)
        publisher = SlicePublisher(
            api, driver=DRIVER, node=node, snapshot=lambda: state.current, resync_s=resync_s
        )
        home = work / node
        home.mkdir()
        driver = DraDriver(
            DriverSettings(DRIVER, node, mps_root=str(home / "mps")),
            objects=api,
            checkpoint=CheckpointFile(home / "checkpoint.json"),
            cdi=CdiSpecStore(home / "cdi", CDI_KIND),
            snapshot=lambda: state.current,
            boot_id="bench",
        )
        await driver.load()
        drivers[node] = driver
        if mode == "watch":
            tasks.append(asyncio.create_task(publisher.run(stop, state)))
            await publisher.published.wait()
            print(f"published {node} {time.time():.6f}", flush=True)
        else:  # the old way: a fresh LIST at every resync
            first = True
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    await publisher.publish_once()
                    if first:
                        print(f"published {node} {time.time():.6f}", flush=True)
                        first = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), resync_s)

    async def claims() -> None:
        """This worker's nodes' kubelets, as far as claims go: prepare what is allocated."""
        try:
            await watch_claims()
        except Exception as exc:
            print(f"claims watch failed: {exc!r}", file=sys.stderr, flush=True)
            raise

    async def watch_claims() -> None:
        client = make_client(Path(kubeconfig), trust_env=False)
        clients.append(client)
        done: set[str] = set()
        async for _kind, claim in client.watch(
            ResourceClaim, namespace=ALL_NS, resource_version="0"
        ):
            allocation = (claim.status.allocation if claim.status else None) if claim else None
            if allocation is None or claim.metadata is None or claim.metadata.uid in done:
                continue
            results = allocation.devices.results if allocation.devices else []
            node = results[0].pool if results else None
            if node not in drivers:
                continue
            uid = str(claim.metadata.uid)
            done.add(uid)
            ref = ClaimRef(str(claim.metadata.namespace), uid, str(claim.metadata.name))
            tasks.append(asyncio.create_task(prepare(drivers[node], ref)))

    async def prepare(driver: Any, ref: Any) -> None:
        result = (await driver.prepare([ref]))[ref.uid]
        status = "prepared" if not result.error else "failed"
        print(f"{status} {ref.uid} {time.time():.6f}", flush=True)

    for node in nodes:
        tasks.append(asyncio.create_task(agent(node)))
    if mode == "watch":
        tasks.append(asyncio.create_task(claims()))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for client in clients:
        with contextlib.suppress(Exception):
            await client.close()


# -- the bench: control plane, nodes, phases ----------------------------------------------


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def requests_by_verb(plane: envtest.ControlPlane) -> Counter[tuple[str, str]]:
    """(verb, resource) -> count, from the API server's own `apiserver_request_total`."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(
        f"{plane.url}/metrics", headers={"Authorization": f"Bearer {envtest.TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        text = response.read().decode()
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                out[(sample.labels.get("verb", ""), sample.labels.get("resource", ""))] += int(
                    sample.value
                )
    return out


def agents(verb: str, resource: str) -> bool:
    """Requests an agent makes: its slices (any verb), claims read at Prepare, its Node.
    Not the bench's own creations (POST of claims and pods) nor the scheduler's writes of
    claim status and bindings."""
    if resource == "resourceslices":
        return True
    if resource == "resourceclaims":
        return verb in ("GET", "LIST")  # the workers' claim watches play the kubelets
    return resource == "nodes" and verb in ("GET", "LIST", "WATCH")


class Window:
    """Requests and control-plane CPU over one phase."""

    def __init__(self, plane: envtest.ControlPlane) -> None:
        self.plane = plane
        self.pids = {
            "kube-apiserver": plane.processes[1].pid,
            "etcd": plane.processes[0].pid,
            "kube-scheduler": plane.processes[2].pid if len(plane.processes) > 2 else 0,
        }

    def __enter__(self) -> Window:
        self.start = time.monotonic()
        self.cpu0 = {k: proc_cpu_s(p) for k, p in self.pids.items() if p}
        self.req0 = requests_by_verb(self.plane)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.start
        self.cpu_pct = {
            k: 100 * (proc_cpu_s(p) - self.cpu0[k]) / self.seconds
            for k, p in self.pids.items()
            if p
        }
        self.rss = {k: proc_rss_mib(p) for k, p in self.pids.items() if p}
        after = requests_by_verb(self.plane)
        self.requests = Counter(
            {k: after[k] - self.req0.get(k, 0) for k in after if after[k] - self.req0.get(k, 0)}
        )

    def per_node_minute(self, nodes: int, verb: str | None = None) -> float:
        total = sum(
            n
            for (v, resource), n in self.requests.items()
            if agents(v, resource) and (verb is None or v == verb)
        )
        return total / max(nodes, 1) / (self.seconds / 60)


def kubectl_ok(plane: envtest.ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = plane.kubectl(*args, stdin=stdin)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def create_all(plane: envtest.ControlPlane, objs: list[Json]) -> None:
    for start in range(0, len(objs), 200):
        batch = {"apiVersion": "v1", "kind": "List", "items": objs[start : start + 200]}
        kubectl_ok(plane, "create", "--validate=false", "-f", "-", stdin=json.dumps(batch))


def node_names(count: int) -> list[str]:
    return [f"scale-{i:04d}" for i in range(count)]


def add_nodes(plane: envtest.ControlPlane, names: list[str]) -> None:
    create_all(
        plane,
        [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}},
            }
            for n in names
        ],
    )
    status = json.dumps(
        {
            "status": {
                "allocatable": {"pods": "110", "cpu": "64", "memory": "512Gi"},
                "capacity": {"pods": "110", "cpu": "64", "memory": "512Gi"},
            }
        }
    )
    for name in names:
        kubectl_ok(
            plane, "patch", "node", name, "--subresource=status", "--type=merge", "-p", status
        )


class Workers:
    def __init__(
        self, plane: envtest.ControlPlane, names: list[str], count: int, mode: str, resync_s: float
    ) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.published: dict[str, float] = {}
        self.prepared: dict[str, float] = {}
        self.failed = 0
        self.started = time.time()
        chunks = [names[i::count] for i in range(count)]
        for chunk in filter(None, chunks):
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--worker",
                        mode,
                        "--kubeconfig",
                        str(plane.kubeconfig),
                        "--resync",
                        str(resync_s),
                        *chunk,
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    stderr=subprocess.DEVNULL,
                )
            )
        self._readers = [
            asyncio.get_event_loop().run_in_executor(None, self._read, p) for p in self.procs
        ]

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            what, key, when = line.split()
            if what == "published":
                self.published[key] = float(when)
            elif what == "prepared":
                self.prepared[key] = float(when)
            else:
                self.failed += 1

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def stop(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            await asyncio.get_running_loop().run_in_executor(None, proc.wait)
        await asyncio.gather(*self._readers)


async def wait_until(ok: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        await asyncio.sleep(0.05)


def slices(plane: envtest.ControlPlane) -> list[Json]:
    return list(json.loads(kubectl_ok(plane, "get", "resourceslices", "-o", "json"))["items"])


async def bench(args: argparse.Namespace) -> None:
    names = node_names(args.nodes)
    with envtest.running() as plane:
        create_all(
            plane,
            [GPU_CLASS, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}],
        )
        create_all(
            plane,
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": NAMESPACE},
                }
            ],
        )
        add_nodes(plane, names)
        print(
            f"{args.nodes} nodes, {args.workers} worker processes, {SIM} "
            f"(time-slicing x2), rest {args.rest:.0f} s per phase"
        )

        await asyncio.sleep(args.settle)
        with Window(plane) as empty:
            await asyncio.sleep(args.rest)

        progress("poll phase")
        polling = Workers(plane, names, args.workers, "poll", args.resync)
        await wait_until(lambda: len(polling.published) == len(names), 300, "poll publish")
        await asyncio.sleep(args.settle)
        with Window(plane) as poll:
            await asyncio.sleep(args.rest)
        await polling.stop()
        kubectl_ok(plane, "delete", "resourceslices", "--all")

        progress("watch phase")
        watching = Workers(plane, names, args.workers, "watch", args.resync)
        await wait_until(lambda: len(watching.published) == len(names), 300, "watch publish")
        publish_s = max(watching.published.values()) - watching.started
        stored = slices(plane)
        await asyncio.sleep(args.settle)
        agent_cpu0 = sum(proc_cpu_s(p) for p in watching.pids())
        with Window(plane) as rest:
            await asyncio.sleep(args.watch_rest or args.rest)
        agent_cpu = 100 * (sum(proc_cpu_s(p) for p in watching.pids()) - agent_cpu0) / rest.seconds

        progress("wipe phase")
        repaired = []
        for name in names[: min(5, len(names))]:
            [old] = [s for s in slices(plane) if s["spec"]["nodeName"] == name]
            started = time.monotonic()
            kubectl_ok(plane, "delete", "resourceslice", old["metadata"]["name"])
            await wait_until(
                lambda n=name: any(s["spec"]["nodeName"] == n for s in slices(plane)),
                30,
                f"{name}'s slice back",
            )
            repaired.append(time.monotonic() - started)

        progress("claims phase")
        claims = []
        for i in range(args.claims):
            claims.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"c{i}", "namespace": NAMESPACE},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                            ]
                        }
                    },
                }
            )
        pods = []
        for i in range(args.claims):
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"p{i}", "namespace": NAMESPACE},
                    "spec": {
                        "tolerations": [{"operator": "Exists"}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}],
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                }
            )
        with Window(plane) as busy:
            started = time.time()
            create_all(plane, claims)
            create_all(plane, pods)
            await wait_until(
                lambda: len(watching.prepared) + watching.failed >= args.claims,
                600,
                f"{args.claims} claims prepared",
            )
            claims_s = max(watching.prepared.values(), default=started) - started
        await watching.stop()

    sizes = [len(json.dumps(s)) for s in stored]
    devices = [len(s["spec"].get("devices") or []) for s in stored]
    n = args.nodes
    print()
    print("| phase | requests/node/min (LIST) | API server CPU % | etcd CPU % | scheduler CPU % |")
    print("|---|---|---|---|---|")
    for label, w in (
        ("no agents", empty),
        ("agents polling (before)", poll),
        ("agents watching, at rest", rest),
        (f"{args.claims} claims (watching)", busy),
    ):
        print(
            f"| {label} | {w.per_node_minute(n):.2f} ({w.per_node_minute(n, 'LIST'):.2f}) | "
            f"{w.cpu_pct['kube-apiserver']:.1f} | {w.cpu_pct['etcd']:.1f} | "
            f"{w.cpu_pct.get('kube-scheduler', 0):.1f} |"
        )
    print()
    print(
        f"published: {n} nodes in {publish_s:.2f} s; slice: {devices[0]} devices, "
        f"{sum(sizes) / len(sizes) / 1024:.1f} KiB (JSON) each"
    )
    print(f"wiped slices back after: {', '.join(f'{t:.2f}' for t in repaired)} s")
    print(
        f"claims: {len(watching.prepared)} prepared ({watching.failed} failed) in {claims_s:.1f} s"
    )
    print(
        f"memory: API server {busy.rss['kube-apiserver']:.0f} MiB, etcd {busy.rss['etcd']:.0f} "
        f"MiB, scheduler {busy.rss.get('kube-scheduler', 0):.0f} MiB; agents at rest "
        f"{agent_cpu / n:.3f} % of a core per node"
    )
    at_rest = rest.requests
    print(
        "requests at rest (verb resource count):",
        ", ".join(f"{v} {r} {c}" for (v, r), c in sorted(at_rest.items())) or "none",
    )
    before = poll.per_node_minute(n)
    after = rest.per_node_minute(n)
    cpu_ratio = rest.cpu_pct["kube-apiserver"] / max(empty.cpu_pct["kube-apiserver"], 0.01)
    print(
        f"Closing note: at rest {after:.2f} requests/node/min watching vs {before:.2f} polling "
        f"({after / before if before else 0:.2f}x); API server CPU at rest with {n} nodes "
        f"{cpu_ratio:.2f}x its CPU with no agents (polling: "
        f"{poll.cpu_pct['kube-apiserver'] / max(empty.cpu_pct['kube-apiserver'], 0.01):.2f}x); "
        f"{n} nodes published in {publish_s:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rest", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument(
        "--watch-rest",
        type=float,
        default=0.0,
        help="seconds at rest in the watch phase (default: --rest); 600 for the 10-minute check",
    )
    parser.add_argument("--resync", type=float, default=10.0)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", choices=("poll", "watch"))
    parser.add_argument("--kubeconfig")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.kubeconfig, args.names, args.worker, args.resync))
        return
    if args.quick:
        args.nodes, args.workers, args.rest, args.settle, args.claims = 4, 2, 3.0, 0.5, 16
        args.resync = 1.0
    # a SIGTERM (a `timeout`, say) ends the run through SystemExit, so the control plane
    # and the workers are stopped on the way out, not left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        envtest.assets()
    except envtest.EnvtestUnavailable as exc:
        print(f"no real API server: {exc}")
        print("Closing note: skipped, no control plane binaries (0.00x)")
        return
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
