#!/usr/bin/env python3
"""Dynamic MIG (partitionable devices) against a static MIG layout, as ratios.

Two simulated nodes of 8 H100 80GB each: **static**, MIG mode with the layout
`1g.10gb*7` made beforehand (56 MIG devices), and **dynamic**, MIG mode with no instance,
every GPU marked dynamic (`core.dra.partitions`: per GPU a counter set and 25 partitions).
For each:

1. **size**: the slices the node publishes: how many, how many devices, how many bytes of
   JSON (what every watcher of ResourceSlices receives);
2. **publish, pure**: building the devices and planning the slices from nothing
   (`dra_devices` / `dynamic_gpus`, `device_json`, `plan_slices`), median of `--rounds`;
3. **publish, real server**: creating those slices on a real kube-apiserver 1.36.2
   (`gpuslice.testing.envtest`), median of `--rounds` fresh pools;
4. **scheduling**: `--claims` claims of one `1g.10gb` each (a CEL selector on the profile,
   the same claim on both nodes) with their pods, created at once; the time until the real
   kube-scheduler allocated every one. On the static node it picks among existing devices;
   on the dynamic node it also sums the counters of every candidate.

Every figure is set against the static node's, measured in the same run. Without the
control plane binaries (`KUBEBUILDER_ASSETS`) parts 3 and 4 are skipped.

    .venv/bin/python bench/bench_dynamic_mig.py [--rounds 20] [--claims 56] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from gpuslice.backends import open_backend
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.partitions import counter_sets, dynamic_gpus, node_devices, with_consumption
from gpuslice.core.dra.publish import device_json, dra_devices, plan_slices
from gpuslice.core.jsontypes import Json
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.testing import envtest

DRIVER = "gpu.nvidia.com"
NAMESPACE = "bench-dynmig"
LABEL = "gpuslice.bench/node"
NODES = {"static": "sim:8xh100-80gb/mig=1g.10gb*7", "dynamic": "sim:8xh100-80gb/mig="}


def inventory(spec: str) -> Inventory:
    backend = open_backend(spec)
    try:
        return backend.inventory()
    finally:
        backend.close()


def wanted(inv: Inventory, dynamic: bool) -> tuple[list[Json], list[Json]]:
    """The node's devices and counter sets, as the publisher builds them."""
    dyn = dynamic_gpus(inv, {"all"} if dynamic else set())
    devices = []
    for device in node_devices(dra_devices(inv), dyn):
        obj = device_json(device, [])
        owner = dyn.get(device.gpu.uuid)
        devices.append(with_consumption(obj, owner) if owner is not None else obj)
    return devices, counter_sets(dyn)


def slices_for(inv: Inventory, dynamic: bool, node: str) -> list[Json]:
    devices, sets = wanted(inv, dynamic)
    changes = plan_slices([], devices, driver=DRIVER, node=node, node_uid="", counter_sets=sets)
    return list(changes.create)


def median_s(fn: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def kubectl(plane: envtest.ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = plane.kubectl(*args, stdin=stdin)
    if done.returncode != 0 and "AlreadyExists" not in done.stderr:
        raise SystemExit(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def create(plane: envtest.ControlPlane, objs: list[Json]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": objs}
    kubectl(plane, "create", "--validate=false", "-f", "-", stdin=json.dumps(doc))


def node(name: str) -> Json:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {LABEL: name}}}


def claim_and_pod(node_name: str, i: int) -> list[Json]:
    name = f"{node_name}-{i}"
    selector = f"device.attributes['{DRIVER}'].profile == '1g.10gb'"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {LABEL: node_name},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    return [claim, pod]


async def real_server(args: argparse.Namespace, invs: dict[str, Inventory]) -> dict[str, float]:
    out: dict[str, float] = {}
    with envtest.running() as plane:
        expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'"
        create(plane, [
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
             "metadata": {"name": "mig.nvidia.com"},
             "spec": {"selectors": [{"cel": {"expression": expression}}]}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        ])  # fmt: skip
        create(plane, [{"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "default", "namespace": NAMESPACE}}])  # fmt: skip
        client = make_client(plane.kubeconfig, trust_env=False)
        try:
            for kind, inv in invs.items():
                samples = []
                for r in range(args.rounds):
                    api = DraApi(client, f"pub-{kind}-{r}", DRIVER)
                    objs = slices_for(inv, kind == "dynamic", f"pub-{kind}-{r}")
                    start = time.perf_counter()
                    for obj in objs:
                        await api.create_slice(obj)
                    samples.append(time.perf_counter() - start)
                out[f"publish-{kind}"] = statistics.median(samples)
            room = {"pods": "500", "cpu": "64", "memory": "256Gi"}
            status = {"status": {"allocatable": room, "capacity": room}}
            for kind, inv in invs.items():
                name = f"sched-{kind}"
                create(plane, [node(name)])
                kubectl(plane, "patch", "node", name, "--subresource=status", "--type=merge",
                        "-p", json.dumps(status))  # fmt: skip
                api = DraApi(client, name, DRIVER)
                for obj in slices_for(inv, kind == "dynamic", name):
                    await api.create_slice(obj)
            for kind in invs:
                name = f"sched-{kind}"
                api = DraApi(client, name, DRIVER)
                objs = [o for i in range(args.claims) for o in claim_and_pod(name, i)]
                start = time.perf_counter()
                create(plane, objs)
                while True:
                    claims = await api.list_claims()
                    done = sum(
                        1
                        for c in claims
                        if c["metadata"]["name"].startswith(f"{name}-")
                        and (c.get("status") or {}).get("allocation")
                    )
                    if done >= args.claims:
                        break
                    if time.perf_counter() - start > 120:
                        raise SystemExit(f"{kind}: {done} of {args.claims} claims allocated")
                    await asyncio.sleep(0.02)
                out[f"schedule-{kind}"] = time.perf_counter() - start
        finally:
            await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--claims", type=int, default=56, help="at most 56 (8 GPUs x 7)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.claims = 3, 14
    args.claims = min(args.claims, 56)
    invs = {kind: inventory(spec) for kind, spec in NODES.items()}

    print("| node | slices | devices | counter sets | JSON bytes | publish, pure (ms) |")
    print("|---|---|---|---|---|---|")
    size: dict[str, tuple[int, int, int]] = {}
    pure: dict[str, float] = {}
    for kind, inv in invs.items():
        objs = slices_for(inv, kind == "dynamic", "n")
        devices = sum(len(o["spec"].get("devices") or ()) for o in objs)
        sets = sum(len(o["spec"].get("sharedCounters") or ()) for o in objs)
        nbytes = sum(len(json.dumps(o, separators=(",", ":"))) for o in objs)
        size[kind] = (len(objs), devices, nbytes)
        pure[kind] = median_s(partial(slices_for, inv, kind == "dynamic", "n"), args.rounds)
        print(f"| {kind} | {len(objs)} | {devices} | {sets} | {nbytes} | {pure[kind] * 1e3:.2f} |")

    ratios = [
        f"{size['dynamic'][0] / size['static'][0]:.2f}x the slices",
        f"{size['dynamic'][2] / size['static'][2]:.2f}x the bytes",
        f"{pure['dynamic'] / pure['static']:.2f}x the pure publish time",
    ]
    try:
        envtest.assets()
    except envtest.EnvtestUnavailable as exc:
        print(f"no real API server: {exc}")
    else:
        real = asyncio.run(real_server(args, invs))
        print()
        print("| node | publish on the real server (ms) | scheduling "
              f"{args.claims} claims (s) |")  # fmt: skip
        print("|---|---|---|")
        for kind in invs:
            print(
                f"| {kind} | {real[f'publish-{kind}'] * 1e3:.1f} | {real[f'schedule-{kind}']:.2f} |"
            )
        ratios.append(
            f"{real['publish-dynamic'] / real['publish-static']:.2f}x the real publish time"
        )
        ratios.append(
            f"{real['schedule-dynamic'] / real['schedule-static']:.2f}x the real scheduler's time "
            f"for {args.claims} 1g.10gb claims"
        )
    print()
    against = "dynamic MIG on 8 H100s against the static 1g.10gb*7 layout"
    print(f"Closing note: {against}: {', '.join(ratios)}")


if __name__ == "__main__":
    main()
