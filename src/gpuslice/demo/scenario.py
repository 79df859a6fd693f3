"""The default demo's first half: 4 pods on 2 GPUs, then NVIDIA's time-slicing config.

The scenario runs the real agent (device plugin servers, registration, live config reload)
against the kubelet emulator over unix sockets in a temp dir, with a simulated GPU backend.
It returns what happened as data (`Step`s) so `gpuslice demo` can print it and tests can
check it; nothing here is staged: every count and env var comes back over gRPC. The
scheduler is played by a count (a pod is bound only when the node's allocatable minus what
is allocated holds its request), so a pod that does not fit stays Pending with the
scheduler's own message instead of reaching the kubelet's admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.agent.front import DevicePluginFrontEnd
from gpuslice.agent.plan import plan_node
from gpuslice.agent.runner import Agent, first_plan, plan_state
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.demo.leak import LeakStory, run_leak_story
from gpuslice.emulator.kubelet import AdmissionError, KubeletEmulator

DEFAULT_NODE = "sim:2xt4"
RESOURCE = "nvidia.com/gpu"

BEFORE_CONFIG = "version: v1\n"
TIME_SLICING_CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""

POD_NAMES = ("trainer", "inference", "notebook", "batch")
"""Four workloads of one team; the first and third land on GPU 0 (see `demo.leak`)."""


def insufficient(resource: str) -> str:
    """kube-scheduler's FailedScheduling message for a one-node cluster."""
    return f"0/1 nodes are available: 1 Insufficient {resource}."


@dataclass(frozen=True, slots=True)
class PodRow:
    name: str
    status: str
    """`Running`, or `Pending` (the scheduler found no room; `reason` says so as
    `kubectl describe pod` does)."""
    devices: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """Per extended resource, as `kubectl describe node` shows them."""

    capacity: dict[str, int]
    allocatable: dict[str, int]
    allocated: dict[str, int]


@dataclass(frozen=True, slots=True)
class Step:
    title: str
    counts: NodeCounts
    pods: tuple[PodRow, ...] = ()
    note: str = ""


@dataclass(slots=True)
class DemoResult:
    node: str
    steps: list[Step] = field(default_factory=list)
    memory: LeakStory | None = None
    """Two of the pods on one time-sliced GPU, one leaking (`demo.leak`)."""
    memory_note: str = ""
    """Why there is no memory story (the config does not time-slice a GPU two pods share)."""


async def _wait(kubelet: KubeletEmulator, predicate: Callable[[], bool], what: str) -> None:
    try:
        await kubelet.wait_for(predicate, 10.0)
    except TimeoutError:
        raise TimeoutError(f"demo: timed out waiting for {what}") from None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.asynccontextmanager
async def _running_node(
    node: str, workdir: Path
) -> AsyncIterator[tuple[KubeletEmulator, Path, Inventory]]:
    plugin_dir = workdir / "dp"
    plugin_dir.mkdir()
    config_path = workdir / "config.yaml"
    _write_atomically(config_path, BEFORE_CONFIG)
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    backend = await asyncio.to_thread(open_backend, node)
    settings = AgentSettings(
        node=node,
        config_path=config_path,
        plugin_dir=plugin_dir,
        kubelet_socket=plugin_dir / "kubelet.sock",
        reload_interval_s=0.1,
        labels_mode="off",
    )
    first = await first_plan(settings, backend)
    state = plan_state(first)
    agent = Agent(settings, backend, state, first, DevicePluginFrontEnd(state, settings))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop), name="demo-agent")
    try:
        yield kubelet, config_path, first.loaded.inventory
    finally:
        stop.set()
        await task
        await kubelet.stop()
        await asyncio.to_thread(backend.close)


def _counts(kubelet: KubeletEmulator) -> NodeCounts:
    names = sorted(kubelet.resources())
    held: dict[str, int] = {}
    for c in kubelet.assignments():
        held[c.resource] = held.get(c.resource, 0) + len(c.device_ids)
    return NodeCounts(
        capacity={n: kubelet.capacity(n) for n in names},
        allocatable={n: kubelet.allocatable(n) for n in names},
        allocated={n: held.get(n, 0) for n in names},
    )


async def _schedule(kubelet: KubeletEmulator, pod: str) -> PodRow:
    counts = _counts(kubelet)
    if counts.allocatable.get(RESOURCE, 0) - counts.allocated.get(RESOURCE, 0) < 1:
        return PodRow(pod, "Pending", reason=insufficient(RESOURCE))
    try:
        admission = await kubelet.admit("default", pod, [("pause", {RESOURCE: 1})])
    except AdmissionError as exc:
        return PodRow(pod, "Failed", reason=f"UnexpectedAdmissionError: {exc}")
    container = admission.containers[0]
    return PodRow(
        pod,
        "Running",
        devices=tuple(container.device_ids),
        env=tuple(sorted(container.envs.items())),
    )


async def run_demo(
    node: str = DEFAULT_NODE, config_text: str = TIME_SLICING_CONFIG, pods: int = 4
) -> DemoResult:
    result = DemoResult(node=node)
    names = [POD_NAMES[i] if i < len(POD_NAMES) else f"job-{i}" for i in range(pods)]
    with tempfile.TemporaryDirectory(prefix="gsdemo-", dir="/tmp") as tmp:
        async with _running_node(node, Path(tmp)) as (kubelet, config_path, inventory):
            await _wait(kubelet, lambda: kubelet.capacity(RESOURCE) > 0, "the plugin to register")
            result.steps.append(
                Step("node registered, no sharing configured", counts=_counts(kubelet))
            )

            rows = [await _schedule(kubelet, n) for n in names]
            result.steps.append(
                Step(
                    f"{pods} pods, each asking {RESOURCE}: 1",
                    pods=tuple(rows),
                    counts=_counts(kubelet),
                )
            )

            before = kubelet.capacity(RESOURCE)
            _write_atomically(config_path, config_text)
            await _wait(
                kubelet,
                lambda: kubelet.capacity(RESOURCE) != before or not kubelet.has(RESOURCE),
                "the new config to be advertised",
            )
            result.steps.append(
                Step(
                    "NVIDIA's config applied live (no restart)",
                    note=config_text,
                    counts=_counts(kubelet),
                )
            )

            rows = [r if r.status == "Running" else await _schedule(kubelet, r.name) for r in rows]
            result.steps.append(
                Step(
                    "the scheduler binds the pending pods",
                    pods=tuple(rows),
                    counts=_counts(kubelet),
                )
            )
    _add_memory_story(result, inventory, config_text)
    return result


def _add_memory_story(result: DemoResult, inventory: Inventory, config_text: str) -> None:
    """The first GPU two running pods share, if the config time-slices it."""
    plan = plan_node(inventory, parse_config(config_text), AgentSettings(node=result.node))
    on_gpu: dict[str, list[str]] = {}
    for pod in result.steps[-1].pods:
        visible = dict(pod.env).get("NVIDIA_VISIBLE_DEVICES", "")
        if pod.status == "Running" and visible and "," not in visible:
            on_gpu.setdefault(visible, []).append(pod.name)
    for res in plan.resources:
        if res.strategy is not SharingStrategy.TIME_SLICING:
            continue
        for dev in res.devices:
            pods = on_gpu.get(dev.physical.uuid, [])
            if len(pods) >= 2 and dev.replicas >= 2 and dev.physical.memory_mib > 0:
                result.memory = run_leak_story(
                    dev.physical.product_name,
                    dev.physical.uuid,
                    dev.physical.memory_mib,
                    dev.replicas,
                    neighbour=pods[0],
                    leaker=pods[1],
                )
                return
    result.memory_note = (
        "no GPU is time-sliced between two running pods with this config, so the memory "
        "part (one pod leaking, NVIDIA's outcome beside gpuslice's) is left out; "
        "`gpuslice demo --scenario guard` tells it on its own"
    )
