#!/usr/bin/env python3
"""DRA claims isolated, through the real `gpuslice plugin --dra` process: figures.

One daemon on `sim:2xh100-80gb` with the fake MPS control program, the DRA kubelet
emulator and the Kubernetes API double, the way `tests/e2e_dra` runs it:

- hung MPS start: claim A (an MPS GpuConfig on gpu-0) has its daemon held at its start
  (`GPUSLICE_FAKE_MPS_HOLD_DIR`); while A's Prepare waits, claim B (plain, gpu-1) is
  prepared and unprepared again and again. B's Prepare p50 and max as multiples of an
  uncontended Prepare p50 (B with nothing else going on, half measured before and half
  after, same daemon, same run); how many of B's Prepares answered while A was pending.
- cancelled Prepare: A's call has a client deadline (as the kubelet's own deadline cancels
  a call); afterwards, what of A is left (MPS daemon processes, MPS directories, CDI specs,
  checkpoint entries: all should be 0), how long the undo took as a multiple of the MPS
  quit grace period it has to wait out for a daemon that never answered, and whether the
  retry (hold removed) succeeds.
- path-hostile claim names: a batch of UIDs, namespaces and names that would leave their
  directory; how many were refused, how many API reads, files and records they caused.

    PYTHONPATH=src .venv/bin/python bench/faults_claims.py [--quick]

`bench_faults.py` runs it as one of its scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpuslice.core.dra.claims import claim_daemon_key
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.jsontypes import Json
from gpuslice.dra.convert import claims_to_v1
from gpuslice.dra.rpc import DraClientV1, unix_target
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator
from gpuslice.emulator.fake_mps_control import HOLD_ENV
from gpuslice.mps.control import process_alive
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver
from gpuslice.testing.daemon import DaemonProcess

DRIVER = "gpu.nvidia.com"
NODE_NAME = "bench-claims"
NODE_SPEC = "sim:2xh100-80gb"
FAKE_MPS = f"{sys.executable} -m gpuslice.emulator.fake_mps_control"
WAIT_S = 60.0
QUIT_GRACE_S = 5.0
"""`ControlProgram`'s default: how long a daemon is given to quit before SIGKILL."""
DEADLINE_S = 6.0
"""A's client deadline: long enough for B's rounds, shorter than the driver's 10 s MPS wait."""
MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
       "sharing": {"strategy": "MPS"}}  # fmt: skip
GPU_CLASS: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
}


@dataclass
class DraNode:
    root: Path
    api: FakeApiServer
    kubelet: DraKubeletEmulator
    daemon: DaemonProcess
    hold_dir: Path

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plug"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    async def until(
        self, predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S
    ) -> float:
        t0 = time.perf_counter()
        while not predicate():
            if time.perf_counter() - t0 > timeout_s or not self.daemon.running:
                raise SystemExit(f"timed out waiting for {what}:\n{self.daemon.log()[-4000:]}")
            await asyncio.sleep(0.02)
        return time.perf_counter() - t0

    def claim(self, name: str, device: str, config: list[Json] | None = None) -> ClaimRef:
        """A claim allocated to `device`, as the scheduler writes it."""
        spec: Json = {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER}}]}}  # fmt: skip
        if config:
            spec["devices"]["config"] = config
        created = self.api.add_claim(
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "default"}, "spec": spec}
        )  # fmt: skip
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": device}
        allocation = {"devices": {"results": [result], "config": [
            dict(c, source="FromClaim") for c in config or []]}}  # fmt: skip
        self.api.set_claim_status(
            "default",
            name,
            {"allocation": allocation,
             "reservedFor": [{"resource": "pods", "name": name, "uid": f"pod-{name}"}]},
        )  # fmt: skip
        return ClaimRef("default", created["metadata"]["uid"], name)

    def gpu_uuid(self, device: str) -> str:
        for s in self.api.resource_slices(NODE_NAME, DRIVER):
            for d in s["spec"]["devices"]:
                if d["name"] == device:
                    return str(d["attributes"]["uuid"]["string"])
        raise SystemExit(f"no device {device} published")

    def recorded(self) -> dict[str, Any]:
        doc = json.loads((self.plugin_dir / "gpuslice-checkpoint.json").read_text("utf-8"))
        claims: dict[str, Any] = doc["data"]["claims"]
        return claims

    def cdi_specs(self) -> list[Path]:
        return sorted(self.cdi_root.glob("*")) if self.cdi_root.exists() else []

    def endpoint(self) -> str:
        registration = self.kubelet.registration(DRIVER)
        if registration is None:
            raise SystemExit("the driver is not registered")
        return registration.endpoint


def dra_agent(
    root: Path,
    kubeconfig: Path,
    node_spec: str = NODE_SPEC,
    log_name: str = "daemon.log",
    nvidia_smi: Path | None = None,
) -> DaemonProcess:
    """The `gpuslice plugin --dra` process of the node in `root` (not started): a function
    of its own so the lifecycle bench can start a second one, or one without an API.
    `nvidia_smi`: the agent sets MPS GPUs' compute modes through it (else it sets none)."""
    modes = ["--nvidia-smi", str(nvidia_smi)] if nvidia_smi else ["--no-compute-mode"]
    return DaemonProcess(
        [
            "--node", node_spec, "--config-file", str(root / "config.yaml"),
            "--node-name", NODE_NAME, "--kubeconfig", str(kubeconfig),
            "--dra", "--dra-plugin-dir", str(root / "plug"),
            "--dra-registry-dir", str(root / "reg"), "--cdi-root", str(root / "cdi"),
            *modes, "--mps-control", FAKE_MPS, "--no-labels",
        ],
        log_path=root / log_name,
        env={"GPUSLICE_SIM_CONTROL_DIR": str(root / "ctl"), HOLD_ENV: str(root / "hold")},
    )  # fmt: skip


@contextlib.asynccontextmanager
async def dra_node(
    before_start: Callable[[Path], None] | None = None, node_spec: str = NODE_SPEC
) -> AsyncIterator[DraNode]:
    """`before_start` gets the plugin directory to put things in before the daemon starts."""
    root = Path(tempfile.mkdtemp(prefix="gsc-", dir="/tmp"))
    if before_start is not None:
        (root / "plug").mkdir()
        before_start(root / "plug")
    hold_dir = root / "hold"
    hold_dir.mkdir()
    (root / "config.yaml").write_text("version: v1\n", encoding="utf-8")
    with running_apiserver() as api:
        api.add_node(NODE_NAME)
        api.add_device_class(GPU_CLASS)
        kubelet = DraKubeletEmulator(root / "reg", tick_s=0.5)
        await kubelet.start()
        daemon = dra_agent(root, api.write_kubeconfig(root / "kubeconfig"), node_spec)
        await daemon.start()
        node = DraNode(root, api, kubelet, daemon, hold_dir)
        try:
            await node.until(
                lambda: (
                    kubelet.registration(DRIVER) is not None
                    and bool(api.resource_slices(NODE_NAME, DRIVER))
                ),
                "registration and slices",
            )
            yield node
        finally:
            await node.daemon.terminate()  # the one running now: a bench may replace it
            await kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)


async def timed_cycle(node: DraNode, ref: ClaimRef) -> float:
    """One Prepare (timed) and its Unprepare (not timed) of `ref`."""
    t0 = time.perf_counter()
    result = (await node.kubelet.prepare(DRIVER, [ref]))[ref.uid]
    elapsed = time.perf_counter() - t0
    if result.error:
        raise SystemExit(f"Prepare of {ref.name} failed: {result.error}")
    errors = await node.kubelet.unprepare(DRIVER, [ref])
    if errors[ref.uid]:
        raise SystemExit(f"Unprepare of {ref.name} failed: {errors[ref.uid]}")
    return elapsed


async def scenario_hung_and_cancelled(node: DraNode, rounds: int) -> None:
    a = node.claim("held-mps", "gpu-0", [{"opaque": {"driver": DRIVER, "parameters": MPS}}])
    b = node.claim("plain", "gpu-1")
    daemon_dir = node.plugin_dir / "mps" / claim_daemon_key(a.uid, [node.gpu_uuid("gpu-0")])
    pid_file = daemon_dir / "pipe" / "nvidia-cuda-mps-control.pid"
    hold = node.hold_dir / daemon_dir.name

    for _ in range(3):  # warm-up
        await timed_cycle(node, b)
    alone = [await timed_cycle(node, b) for _ in range(rounds // 2)]

    hold.touch()
    async with grpc.aio.insecure_channel(unix_target(node.endpoint())) as channel:
        call = asyncio.create_task(
            DraClientV1(channel).prepare(
                v1.NodePrepareResourcesRequest(claims=claims_to_v1([a])), timeout_s=DEADLINE_S
            )
        )
        await node.until(lambda: pid_file.exists() or call.done(), "A's daemon started")
        pid = int(pid_file.read_text()) if pid_file.exists() else 0
        contended: list[float] = []
        while len(contended) < rounds and not call.done():
            contended.append(await timed_cycle(node, b))
        while_pending = len(contended) if not call.done() else len(contended) - 1
        try:
            await call
            outcome = "answered"
        except grpc.aio.AioRpcError as exc:
            outcome = exc.code().name

    def left() -> tuple[int, int, int, int]:
        return (
            int(pid != 0 and process_alive(pid)),
            int(daemon_dir.exists()),
            len([p for p in node.cdi_specs() if a.uid in p.name]),
            int(a.uid in node.recorded()),
        )

    undo_s = await node.until(lambda: left() == (0, 0, 0, 0), "A undone")
    alone += [await timed_cycle(node, b) for _ in range(rounds - rounds // 2)]

    base = statistics.median(alone)
    print(
        f"claims, hung MPS start: {len(contended)} Prepares of another claim while A's daemon "
        f"hung, {while_pending} answered with A pending; p50 "
        f"{statistics.median(contended) / base:.2f}x, max {max(contended) / base:.2f}x an "
        f"uncontended Prepare p50 ({base * 1e3:.1f} ms, {len(alone)} rounds)"
    )
    daemons, dirs, specs, records = left()
    hold.unlink()
    retry = (await node.kubelet.prepare(DRIVER, [a]))[a.uid]
    retried = "succeeded" if not retry.error else f"failed: {retry.error}"
    await node.kubelet.unprepare(DRIVER, [a])
    print(
        f"claims, cancelled Prepare: A's call ended {outcome} after its {DEADLINE_S:g} s "
        f"deadline; left of A: {daemons} MPS daemons, {dirs} MPS directories, {specs} CDI "
        f"specs, {records} checkpoint entries; undone {undo_s / QUIT_GRACE_S:.2f}x the "
        f"{QUIT_GRACE_S:g} s MPS quit grace after the deadline; retry {retried}"
    )


async def scenario_hostile(node: DraNode, count: int) -> None:
    shapes: list[Callable[[int], ClaimRef]] = [
        lambda i: ClaimRef("default", f"../../../../tmp/evil-{i}", "c"),
        lambda i: ClaimRef("default", f"{uuid.uuid4()}/../x{i}", "c"),
        lambda i: ClaimRef("default", "." * (i % 3 + 1) + f"{i}", "c"),
        lambda i: ClaimRef(f"../ns-{i}", str(uuid.uuid4()), "c"),
        lambda i: ClaimRef("default", str(uuid.uuid4()), f"../../name-{i}"),
    ]
    refs = [shapes[i % len(shapes)](i) for i in range(count)]
    reads_before = len([r for r in node.api.requests if "resourceclaims" in r.path])
    files_before = sum(1 for _ in node.root.rglob("*"))
    prepared = await node.kubelet.prepare(DRIVER, refs)
    unprepared = await node.kubelet.unprepare(DRIVER, refs)
    refused = sum(r.error.startswith("refused: claim.") for r in prepared.values())
    refused_un = sum(e.startswith("refused: claim.") for e in unprepared.values())
    reads = len([r for r in node.api.requests if "resourceclaims" in r.path]) - reads_before
    files = sum(1 for _ in node.root.rglob("*")) - files_before
    print(
        f"claims, hostile names: {count} path-hostile claims (UID, namespace, name): "
        f"{refused} Prepares and {refused_un} Unprepares refused naming the field; "
        f"{reads} API reads, {files} files and {len(node.recorded())} checkpoint entries "
        f"made; daemon running: {node.daemon.running}"
    )


async def scenario_claims(quick: bool) -> None:
    """The claim scenarios, for `bench_faults.py`."""
    async with dra_node() as node:
        await scenario_hung_and_cancelled(node, 10 if quick else 40)
        await scenario_hostile(node, 10 if quick else 200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    asyncio.run(scenario_claims(parser.parse_args().quick))


if __name__ == "__main__":
    main()
