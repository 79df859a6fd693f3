"""`gpuslice demo --dra`: the agent as a DRA driver on an emulated node, claims end to end.

The real agent runs in DRA mode (`agent.dra_front.dra_front_end`: slice publisher, Prepare and
Unprepare, plugin registration, a claim MPS daemon on the fake MPS control program) with
the in-memory API objects of `emulator.dra_store` and the DRA kubelet emulator over unix
sockets in a temp dir; `DraStore.allocate_claim` plays the scheduler. Every value in the
returned `DraStep`s comes back from the driver: the slices it published, the CDI device IDs
Prepare returned over gRPC, the env and mounts of the CDI spec files it wrote, and the MPS
daemon its manager started. Step 4 is `gpuslice describe --claims` on the same node and
claims (`whatif.claims`), so the prediction can be read against what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuslice.agent.dra_front import DraFrontEnd, dra_front_end
from gpuslice.agent.runner import Agent, first_plan, plan_state
from gpuslice.agent.settings import AgentSettings, DraSettings
from gpuslice.backends import open_backend
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.jsontypes import Json
from gpuslice.dra.server import DraServerSettings
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator
from gpuslice.emulator.dra_store import DraStore
from gpuslice.whatif.allocator import AllocationError
from gpuslice.whatif.claims import (
    DEFAULT_DEVICE_CLASSES,
    DRIVER,
    Mount,
    SliceDevice,
    WhatIf,
    slice_devices,
    what_if,
)

DRA_NODE = "sim:1xh100-80gb,1xh100-80gb/mig=1g.10gb*7"
"""GPU 0 whole, GPU 1 split into seven 1g.10gb MIG devices."""
NODE_NAME = "demo-node"
NAMESPACE = "default"
NODE_CONFIG = "version: v1\nflags:\n  migStrategy: mixed\n"
"""In DRA mode the config only decides which GPUs are offered as shares (none here). The
MIG strategy does not change what is published; `mixed` only keeps the agent from warning,
as it does under `none`, that device-plugin containers could not use a MIG-mode GPU."""
MIG_SELECTOR = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"

MPS_CLAIM: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "shared-mps", "namespace": NAMESPACE},
    "spec": {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [
                {
                    "requests": ["gpu"],
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": "resource.nvidia.com/v1beta1",
                            "kind": "GpuConfig",
                            "sharing": {
                                "strategy": "MPS",
                                "mpsConfig": {
                                    "defaultActiveThreadPercentage": 50,
                                    "defaultPinnedDeviceMemoryLimit": "20Gi",
                                },
                            },
                        },
                    },
                }
            ],
        }
    },
}
MIG_CLAIM: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "small-mig", "namespace": NAMESPACE},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": "mig.nvidia.com",
                        "selectors": [{"cel": {"expression": MIG_SELECTOR}}],
                    },
                }
            ]
        }
    },
}
EXTRA_CLAIM: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "one-more-gpu", "namespace": NAMESPACE},
    "spec": {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
    },
}
"""Only in the what-if: a second whole GPU, which this node does not have."""

MPS_CONTROL = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")
"""No GPU, no MPS: the fake control program (in the wheel) plays `nvidia-cuda-mps-control`."""
MPS_PODS = ("inference-7d4b9c-kx2lp", "inference-7d4b9c-q8zfn")
MIG_POD = "notebook-0"


class DemoError(Exception):
    """The driver or the emulated kubelet did not do what the demo expects."""


@dataclass(frozen=True, slots=True)
class ClaimView:
    """A ResourceClaim as `kubectl get resourceclaim -o yaml` shows its status."""

    namespace: str
    name: str
    uid: str
    devices: tuple[tuple[str, str], ...]
    """(request, device) of each allocation result."""
    reserved_for: tuple[str, ...]
    config: str = ""
    """The claim's opaque config in one line, if any."""


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    claim: str
    prepared: bool
    """True: this pod's start had the kubelet call NodePrepareResources; False: the kubelet
    reused the claim it had prepared for an earlier pod."""
    cdi_ids: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    """The container env the CDI spec adds, in the spec's order."""
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True, slots=True)
class MpsDaemonView:
    """A claim's MPS control daemon, and the defaults it answers with when asked through
    its control program (`get_default_active_thread_percentage`, ...), as an operator
    would ask `nvidia-cuda-mps-control`."""

    key: str
    ready: bool
    pipe_dir: str
    gpu_indices: tuple[int, ...]
    active_thread_percentage: str = ""
    pinned_limits: tuple[tuple[int, str], ...] = ()
    """(GPU index, limit as the daemon prints it, e.g. `20480M`)."""


@dataclass(frozen=True, slots=True)
class DraStep:
    title: str
    note: str = ""
    devices: tuple[SliceDevice, ...] = ()
    claims: tuple[ClaimView, ...] = ()
    pods: tuple[PodView, ...] = ()
    what_if: WhatIf | None = None
    cdi_specs: tuple[str, ...] = ()
    """CDI spec files in the CDI directory after the step."""
    mps_daemons: tuple[MpsDaemonView, ...] = ()
    """The claim MPS daemons the agent runs after the step."""


@dataclass(slots=True)
class DraDemoResult:
    node: str
    driver: str
    node_name: str
    steps: list[DraStep] = field(default_factory=list)


@dataclass(slots=True)
class _Node:
    store: DraStore
    kubelet: DraKubeletEmulator
    front: DraFrontEnd
    agent: Agent
    cdi_root: Path
    mps_root: Path

    def cdi_specs(self) -> tuple[str, ...]:
        if not self.cdi_root.exists():
            return ()
        return tuple(sorted(p.name for p in self.cdi_root.iterdir() if p.suffix == ".yaml"))

    async def mps_daemons(self) -> tuple[MpsDaemonView, ...]:
        mps = self.front.mps
        if mps is None:
            return ()
        ready = mps.readiness()
        out = []
        for spec in sorted(mps.specs, key=lambda s: str(s.resource)):
            asked = ["get_default_active_thread_percentage"] + [
                f"get_default_device_pinned_mem_limit {i}" for i in spec.gpu_indices
            ]
            answers = await _ask_mps(spec.pipe_dir, asked) if ready.get(spec.resource) else []
            out.append(
                MpsDaemonView(
                    key=str(spec.resource),
                    ready=bool(ready.get(spec.resource)),
                    pipe_dir=spec.pipe_dir,
                    gpu_indices=tuple(spec.gpu_indices),
                    active_thread_percentage=answers[0] if answers else "",
                    pinned_limits=tuple(zip(spec.gpu_indices, answers[1:], strict=False)),
                )
            )
        return tuple(out)


async def _ask_mps(pipe_dir: str, commands: list[str]) -> list[str]:
    """The daemon's answers, one line per command, through the control program as a
    client (the fake one here; `nvidia-cuda-mps-control` on a GPU node)."""
    proc = await asyncio.create_subprocess_exec(
        *MPS_CONTROL,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
    )
    out, err = await asyncio.wait_for(proc.communicate("\n".join(commands).encode() + b"\n"), 10)
    if proc.returncode != 0:
        raise DemoError(f"MPS daemon at {pipe_dir} did not answer: {err.decode().strip()}")
    return out.decode().splitlines()


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: timed out waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _running_dra_node(
    node: str, workdir: Path, node_config: str = NODE_CONFIG
) -> AsyncIterator[_Node]:
    store = DraStore(NODE_NAME, DRIVER)
    for device_class in DEFAULT_DEVICE_CLASSES:
        store.add_device_class(device_class)
    dra = DraSettings(
        plugin_dir=workdir / "plugin",
        registry_dir=workdir / "registry",
        cdi_root=workdir / "cdi",
        resync_s=1.0,
    )
    config = workdir / "config.yaml"
    config.write_text(node_config, encoding="utf-8")
    kubelet = DraKubeletEmulator(dra.registry_dir, tick_s=0.5)
    await kubelet.start()
    backend = await asyncio.to_thread(open_backend, node)
    settings = AgentSettings(
        node=node,
        config_path=config,
        node_name=NODE_NAME,
        labels_mode="off",
        reload_interval_s=0.5,
        mps_control=MPS_CONTROL,
        set_compute_mode=False,
        mps_shm_tmpfs=False,  # a simulated node: nothing to mount on the host running it
        dra=dra,
    )
    first = await first_plan(settings, backend)
    state = plan_state(first)
    front = dra_front_end(
        state,
        settings,
        dra,
        store,
        server_settings=DraServerSettings(check_tick_s=1.0),
        backend=backend,
        driver_roots=None,  # a simulated node has no driver files: claims name their GPUs
    )
    agent = Agent(settings, backend, state, first, front)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop), name="demo-dra-agent")
    try:
        await _until(
            lambda: (
                task.done() or (kubelet.registration(DRIVER) is not None and bool(store.slices()))
            ),
            "the DRA driver to register and publish its ResourceSlices",
        )
        if task.done():
            task.result()  # the agent stopped: its exception says why
            raise DemoError("the agent stopped before registering")
        yield _Node(store, kubelet, front, agent, dra.cdi_root, dra.plugin_path / "mps")
    finally:
        stop.set()
        await task
        await kubelet.stop()
        await asyncio.to_thread(backend.close)


def _claim_view(store: DraStore, namespace: str, name: str) -> ClaimView:
    claim = store.claim(namespace, name)
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    config = ""
    for entry in (claim["spec"]["devices"].get("config") or ())[:1]:
        params = (entry.get("opaque") or {}).get("parameters") or {}
        sharing = params.get("sharing") or {}
        settings = sharing.get("mpsConfig") or sharing.get("timeSlicingConfig") or {}
        words = ", ".join(f"{k}={v}" for k, v in settings.items())
        config = f"{params.get('kind')} {sharing.get('strategy', '')} {words}".strip()
    return ClaimView(
        namespace=namespace,
        name=name,
        uid=str(claim["metadata"]["uid"]),
        devices=tuple((str(r["request"]), str(r["device"])) for r in results),
        reserved_for=tuple(str(r.get("name")) for r in status.get("reservedFor") or ()),
        config=config,
    )


def _pod_view(
    node: _Node, pod: str, claim: str, result: PrepareResult, *, prepared: bool
) -> PodView:
    """What the runtime gives the pod's container: the CDI spec entries of its device IDs."""
    ids = tuple(i for d in result.devices for i in d.cdi_ids)
    env: list[tuple[str, str]] = []
    mounts: list[Mount] = []
    for cdi_id in ids:
        kind, _, name = cdi_id.partition("=")
        entry = _cdi_entry(node.cdi_root, kind, name)
        edits = entry.get("containerEdits") or {}
        for e in edits.get("env") or ():
            key, _, value = str(e).partition("=")
            env.append((key, value))
        mounts += [Mount(m["hostPath"], m["containerPath"]) for m in edits.get("mounts") or ()]
    return PodView(pod, claim, prepared, ids, tuple(env), tuple(mounts))


def _cdi_entry(root: Path, kind: str, name: str) -> Json:
    """The device `name` of kind `kind` in the CDI spec files, as a runtime looks it up."""
    for path in sorted(root.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if spec.get("kind") != kind:
            continue
        for device in spec.get("devices") or ():
            if device.get("name") == name:
                return dict(device)
    raise DemoError(f"no CDI spec in {root} has device {kind}={name}")


async def _prepare(node: _Node, ref: ClaimRef) -> PrepareResult:
    result = (await node.kubelet.prepare(DRIVER, [ref]))[ref.uid]
    if result.error:
        raise DemoError(f"NodePrepareResources for {ref.namespace}/{ref.name}: {result.error}")
    return result


def _add_and_allocate(node: _Node, claim: Json, pods: tuple[str, ...]) -> ClaimRef:
    created = node.store.add_claim(claim)
    ns, name = created["metadata"]["namespace"], created["metadata"]["name"]
    for pod in pods:  # the scheduler, once per pod that references the claim
        try:
            node.store.allocate_claim(ns, name, pod_uid=f"uid-{pod}", pod_name=pod)
        except AllocationError as exc:
            raise DemoError(
                f"{exc} (the DRA demo needs a whole GPU and one with 1g.10gb MIG devices, "
                f"such as {DRA_NODE})"
            ) from None
    return ClaimRef(ns, str(created["metadata"]["uid"]), name)


async def run_dra_demo(node: str = DRA_NODE) -> DraDemoResult:
    result = DraDemoResult(node=node, driver=DRIVER, node_name=NODE_NAME)
    with tempfile.TemporaryDirectory(prefix="gsdra-", dir="/tmp") as tmp:
        async with _running_dra_node(node, Path(tmp)) as n:
            result.steps.append(
                DraStep(
                    "driver registered with the kubelet; the node's ResourceSlices",
                    devices=slice_devices(n.store.slices(node=NODE_NAME, driver=DRIVER)),
                )
            )

            mps_ref = _add_and_allocate(n, MPS_CLAIM, MPS_PODS)
            first = await _prepare(n, mps_ref)
            claim = f"{mps_ref.namespace}/{mps_ref.name}"
            pods = (
                _pod_view(n, MPS_PODS[0], claim, first, prepared=True),
                # the kubelet prepares a claim once; later pods reuse its CDI device IDs
                _pod_view(n, MPS_PODS[1], claim, first, prepared=False),
            )
            result.steps.append(
                DraStep(
                    "a claim with NVIDIA's GpuConfig (MPS), shared by two pods",
                    note=yaml.safe_dump(MPS_CLAIM["spec"], sort_keys=False),
                    claims=(_claim_view(n.store, mps_ref.namespace, mps_ref.name),),
                    pods=pods,
                    cdi_specs=n.cdi_specs(),
                    mps_daemons=await n.mps_daemons(),
                )
            )

            mig_ref = _add_and_allocate(n, MIG_CLAIM, (MIG_POD,))
            mig = await _prepare(n, mig_ref)
            result.steps.append(
                DraStep(
                    "a third pod: a MIG device chosen by CEL",
                    note=f"selector: {MIG_SELECTOR}",
                    claims=(_claim_view(n.store, mig_ref.namespace, mig_ref.name),),
                    pods=(
                        _pod_view(
                            n, MIG_POD, f"{mig_ref.namespace}/{mig_ref.name}", mig, prepared=True
                        ),
                    ),
                    cdi_specs=n.cdi_specs(),
                    mps_daemons=await n.mps_daemons(),
                )
            )

            snap = n.agent.state.current
            # the claims as users wrote them (UIDs kept, so paths compare), plus one more
            asked = [
                {k: v for k, v in n.store.claim(r.namespace, r.name).items() if k != "status"}
                for r in (mps_ref, mig_ref)
            ] + [EXTRA_CLAIM]
            predicted = what_if(
                snap.inventory,
                snap.plan,
                asked,
                n.store.device_classes(),
                driver=DRIVER,
                pool=NODE_NAME,
                mps_root=str(n.mps_root),
            )
            result.steps.append(
                DraStep(
                    "gpuslice describe --claims: the same claims predicted on an empty node, "
                    "plus one more",
                    note="what-if: allocated by the scheduler double, Prepare computed, "
                    "nothing applied",
                    what_if=predicted,
                )
            )

            errors = await n.kubelet.unprepare(DRIVER, [mps_ref, mig_ref])
            failed = {uid: e for uid, e in errors.items() if e}
            if failed:
                raise DemoError(f"NodeUnprepareResources failed: {failed}")
            result.steps.append(
                DraStep(
                    "pods deleted: the kubelet unprepares both claims",
                    claims=tuple(
                        _claim_view(n.store, r.namespace, r.name) for r in (mps_ref, mig_ref)
                    ),
                    cdi_specs=n.cdi_specs(),
                    mps_daemons=await n.mps_daemons(),
                )
            )
    return result
