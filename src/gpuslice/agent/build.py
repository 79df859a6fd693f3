"""Building an agent from settings: opens the backend and wires the optional adapters.

Kept apart from `runner` so tests and the demo can hand the agent their own doubles
(a simulated backend, an emulated kubelet, a fake MPS control program) while
`gpuslice plugin` gets the real ones. Each `wire_*` function adds one adapter's hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from gpuslice.agent.caps import (
    CapsApplier,
    CapsService,
    HookProgram,
    gpu_capabilities,
    node_capability,
    pod_containers,
)
from gpuslice.agent.cdi_base import BaseSpec, DriverRoots
from gpuslice.agent.dra_driver import ClaimWarn, DraCaps, DraDriver, DriverSettings
from gpuslice.agent.dra_front import DraFrontEnd
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.agent.dynamic_mig import JOURNAL_NAME as DYNAMIC_MIG_RECORD
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.agent.front import DevicePluginFrontEnd, FrontEnd
from gpuslice.agent.guard_view import guard_view_reader, idle_probe
from gpuslice.agent.inventory_watch import inventory_watcher
from gpuslice.agent.knobs import knob_of
from gpuslice.agent.runner import Agent, AgentHooks, FirstPlan, first_plan, plan_state
from gpuslice.agent.settings import AgentSettings, DraSettings
from gpuslice.backends import memory_limiter_of, open_backend
from gpuslice.core.caps import CapsView, GpuCapability, caps_view
from gpuslice.core.cordon import CORDON_ANNOTATION, Cordon
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.errors import GpusliceError
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.labels import gfd_labels
from gpuslice.core.mps import mps_specs
from gpuslice.core.sharing.model import Plan, SharingStrategy
from gpuslice.dra.server import DraServerSettings
from gpuslice.guard import MemoryGuard, ProcessSignaller, own_pod_uid
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import (
    CHECKPOINT_NAME,
    OLD_CHECKPOINT_NAME,
    CheckpointFile,
    boot_id,
)
from gpuslice.host.labelfile import LabelFile
from gpuslice.logs import get_logger
from gpuslice.metrics import MetricsServer, SnapshotRefresher, exporter_registry
from gpuslice.metrics.caps import CapsCollector
from gpuslice.metrics.server import ServerLimits
from gpuslice.metrics.status import build_status
from gpuslice.mps import (
    ControlProgram,
    MpsDaemonManager,
    MpsTimings,
)
from gpuslice.mps.shm import ShmMounts
from gpuslice.nvsmi import NvidiaSmi
from gpuslice.podresources import PodResourcesClient
from gpuslice.ports import DraObjects, GpuBackend, MigPartitioner, TimesliceSetter
from gpuslice.state import PlanState

if TYPE_CHECKING:
    # The Kubernetes client (lightkube, httpx: about 11 MiB resident) is imported only
    # where the agent talks to an API server: a device plugin without one never loads it.
    from lightkube import AsyncClient

    from gpuslice.k8s import AgentPod, NodeEvents, NodeLabeler, NodePods
    from gpuslice.k8s.claimevents import ClaimEvents

log = get_logger("gpuslice.agent")


def wire_mps(
    state: PlanState,
    hooks: AgentHooks,
    set_withdrawn: Callable[[frozenset[str]], None],
    *,
    control: tuple[str, ...],
    set_compute_mode: bool,
    nvidia_smi: tuple[str, ...] = ("nvidia-smi",),
    timings: MpsTimings | None = None,
    shm_tmpfs: bool = False,
) -> MpsDaemonManager:
    """Run an MPS control daemon per MPS resource; its replicas are Unhealthy while it is down.

    NVIDIA's plugin advertises MPS replicas even when no daemon answers, and pods then fail
    with "remote procedural call between the MPS server and the MPS client failed"; here the
    kubelet sees them Unhealthy (not allocatable) until the daemon answers.

    The daemons outlive the agent (as in DRA mode): quitting one cuts every client of every
    pod using it, so a stopping agent leaves them and the next one takes over those started
    with the settings its plan wants. Only a plan without them or with other settings stops
    them: a config reload, or the next agent's first plan (`quit_left_behind`, before the
    front end advertises anything). `shm_tmpfs`: the daemons' shared shm directory is a
    size-limited tmpfs (`mps.shm`).
    """

    def withdraw_down_daemons(_resource: str = "", _ready: bool = False) -> None:
        plan = state.current.plan
        set_withdrawn(
            frozenset(
                dev.physical.uuid
                for res in plan.resources
                if res.strategy == SharingStrategy.MPS and not manager.ready(res.name)
                for dev in res.devices
            )
        )

    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(control),
        compute_mode=NvidiaSmi(nvidia_smi) if set_compute_mode else None,
        timings=timings,
        on_readiness=withdraw_down_daemons,
        keep_running=True,  # pods' clients outlive an agent stop, crash or rollout
        shm=ShmMounts() if shm_tmpfs else None,
    )

    started = False

    async def on_plan(plan: Plan, _inventory: Inventory) -> None:
        nonlocal started
        await manager.reconfigure(mps_specs(plan))
        if not started:  # the first plan, put in force before the front end serves it
            started = True
            await manager.quit_left_behind(plan.allocate.mps_root)
        withdraw_down_daemons()

    hooks.on_plan.append(on_plan)
    hooks.services.append(manager.run)
    return manager


def dra_front_end(
    state: PlanState,
    settings: AgentSettings,
    dra: DraSettings,
    objects: DraObjects,
    *,
    timeslice: TimesliceSetter | None = None,
    warn: Callable[[str, str], Awaitable[None]] | None = None,
    claim_warn: ClaimWarn | None = None,
    server_settings: DraServerSettings | None = None,
    mps_timings: MpsTimings | None = None,
    backend: GpuBackend | None = None,
    driver_roots: DriverRoots | None,
) -> DraFrontEnd:
    """Serve the node's GPUs as a DRA driver (docs/dra.md) instead of device plugins.

    Claims' MPS daemons get their own manager under the plugin directory; the device
    plugin's manager is not wired in this mode, so the two never start daemons on one GPU.
    The node's name is checked by `AgentSettings.problems` before anything starts.
    `backend`, when it makes MIG devices (`ports.MigPartitioner`: both do), serves dynamic
    MIG (`flags.dynamicMig`, `agent.dynamic_mig`). `driver_roots`: where the driver's
    files are for the node's base CDI spec (`agent.cdi_base`); None where the node has none
    to give (a simulated node), so claims name their GPUs in the environment.
    """
    plugin_dir = dra.plugin_path
    smi = NvidiaSmi(settings.nvidia_smi)
    mps = MpsDaemonManager(
        [],
        ControlProgram.factory(settings.mps_control),
        # no compute_mode: the driver sets it as a recorded step of each claim, so a crash
        # mid-Prepare is undone from the record (core.dra.preparation.SetComputeMode)
        timings=mps_timings or MpsTimings(health_interval_s=settings.mps_health_interval_s),
        keep_running=True,  # claims' pods outlive an agent restart; so do their daemons
        shm=ShmMounts() if settings.mps_shm_tmpfs else None,
    )

    def dynamic() -> tuple[str, ...]:
        return state.snapshot().plan.dynamic_mig

    partitioner = backend if isinstance(backend, MigPartitioner) else None
    dynamic_mig = (
        None
        if partitioner is None
        else DynamicMig(
            partitioner, CheckpointFile(plugin_dir / DYNAMIC_MIG_RECORD), boot_id(), warn=warn
        )
    )
    driver = DraDriver(
        DriverSettings(
            driver=dra.driver_name,
            node=settings.node_name,
            mps_root=str(plugin_dir / "mps"),
            consumable_shares=dra.consumable_shares,
        ),
        objects=objects,
        checkpoint=CheckpointFile(plugin_dir / CHECKPOINT_NAME),
        cdi=CdiSpecStore(dra.cdi_root, CDI_KIND),
        snapshot=state.snapshot,
        boot_id=boot_id(),
        mps=mps,
        timeslice=timeslice if timeslice is not None else smi,
        warn=warn,
        claim_warn=claim_warn,
        old_checkpoint=CheckpointFile(plugin_dir / OLD_CHECKPOINT_NAME),
        dynamic_mig=dynamic_mig,
        dynamic=dynamic,
        compute_mode=smi if settings.set_compute_mode else None,
        base=None if driver_roots is None else BaseSpec(dra.cdi_root, driver_roots),
    )
    publisher = SlicePublisher(
        objects,
        driver=dra.driver_name,
        node=settings.node_name,
        snapshot=state.snapshot,
        resync_s=dra.resync_s,
        shares=dra.consumable_shares,
        dynamic=dynamic,
        ours=frozenset if dynamic_mig is None else dynamic_mig.ours,
    )
    return DraFrontEnd(
        state,
        driver_name=dra.driver_name,
        plugin_dir=plugin_dir,
        registry_dir=dra.registry_dir,
        driver=driver,
        publisher=publisher,
        mps=mps,
        server_settings=server_settings,
        node_name=settings.node_name,  # the pool the slices name
    )


def snapshot_refresher(
    settings: AgentSettings,
    backend: GpuBackend,
    front: FrontEnd,
    pods: NodePods | None = None,
) -> SnapshotRefresher:
    """The one attribution poll (NVML processes and telemetry, PodResources, `/proc`) that
    the exporter and the memory guard share: the guard refreshes it at its own interval,
    and the exporter's loop only refreshes when nobody did within `metrics_interval_s`."""
    return SnapshotRefresher(
        backend=backend,
        assignments=PodResourcesClient(
            settings.pod_resources_socket,
            dra_driver=None if settings.dra is None else settings.dra.driver_name,
        ),
        current=front.attributed_plan,
        hostname=settings.node_name or socket.gethostname(),
        proc_root=settings.proc_root,
        interval_s=settings.metrics_interval_s,
        pods=pods.uid_map if pods is not None else None,
        container_names=pods.container_names if pods is not None else None,
    )


def wire_metrics(
    agent: Agent,
    *,
    port: int,
    host: str = "0.0.0.0",
    pods: NodePods | None = None,
    guard: MemoryGuard | None = None,
    gpu_metrics: bool = True,
    refresher: SnapshotRefresher | None = None,
    limits: ServerLimits | None = None,
    caps: WiredCaps | None = None,
    mps: MpsDaemonManager | None = None,
) -> MetricsServer:
    """Serve Prometheus metrics, the probes and `/status`; scrapes read the latest snapshot
    and never wait on NVML. `gpu_metrics=False` serves the probes and the plugin's counters
    without gathering GPU telemetry.

    `pods` (this node's pods from the API server) maps a process's pod UID to its pod: the
    only way to tell apart several pods time-slicing one GPU. Without it, attribution falls
    back to the sole holder of a GPU (see `core.attribution`).
    """
    settings = agent.settings
    if refresher is None:
        refresher = snapshot_refresher(settings, agent.backend, agent.front_end, pods)
    registry, counters = exporter_registry(refresher.read_latest if gpu_metrics else _nothing)
    if gpu_metrics and caps is not None:
        registry.register(
            CapsCollector(
                caps.view,
                lambda: {g.uuid: g.index for g in agent.state.current.inventory.gpus},
            )
        )

    def status() -> dict[str, object]:
        return build_status(
            node_name=refresher.hostname,
            config_name=agent.loaded.name,
            plan=agent.state.current.plan,
            snapshot=refresher.latest if gpu_metrics else None,
            gpu_metrics=gpu_metrics,
            pod_resources_socket=str(settings.pod_resources_socket),
            pod_resources_present=settings.pod_resources_socket.exists(),
            ready=agent.readiness(),
            caps=None if caps is None else caps.view(),
            mps_daemons=None
            if mps is None
            else [
                {"resource": d.resource, "state": d.state, "problem": d.problem}
                for d in mps.daemons()
            ],
        )

    server = MetricsServer(
        registry, host=host, port=port, ready=agent.readiness, status=status, limits=limits
    )

    async def on_config(_name: str, accepted: bool, _message: str) -> None:
        counters.record_config_reload(accepted)

    async def serve(stop: asyncio.Event) -> None:
        await listen(server, "metrics_port")
        async with server:
            log.info("metrics-listening", url=server.url)
            await stop.wait()

    agent.hooks.on_config.append(on_config)
    agent.hooks.on_health.append(counters.record_health_transition)
    agent.hooks.services.append(serve)
    if gpu_metrics:
        agent.hooks.services.append(refresher.run)
    if pods is not None and gpu_metrics:
        agent.hooks.services.append(pods.run)
    agent.front_end.on_allocate = counters.record_allocate
    if guard is not None:
        guard.on_decision = counters.record_decision
    return server


def _nothing() -> None:
    """The exporter's snapshot source with GPU metrics off: never a snapshot."""
    return


class PortUnavailable(GpusliceError):
    """A listener's port cannot be bound (taken, or not ours to bind)."""


async def listen(server: MetricsServer, setting: str) -> None:
    """Bind the server's port, or end the agent with one line naming the port and every
    name it may have been set by: a port another process holds (dcgm-exporter's 9400
    under hostNetwork) is a setting to change, not a crash to read a traceback for."""
    try:
        await server.start()
    except OSError as exc:
        raise PortUnavailable(
            f"cannot listen on {server.host or '*'}:{server.requested_port}: "
            f"{os.strerror(exc.errno) if exc.errno else exc}; choose another port with "
            f"{knob_of(AgentSettings, setting).names()}"
        ) from None


PROBE_LIMITS = ServerLimits(max_connections=128, max_per_address=8, max_scrapes=1)
"""The probe listener's own capacity: the kubelet opens one connection per probe."""


def wire_probes(
    agent: Agent, *, port: int, host: str = "0.0.0.0", limits: ServerLimits = PROBE_LIMITS
) -> MetricsServer:
    """`/healthz` and `/readyz` on a listener of their own (`--health-port`): whatever the
    scrape port's clients do, the kubelet's probes meet only this listener's clients."""
    server = MetricsServer(
        CollectorRegistry(auto_describe=False),
        host=host,
        port=port,
        ready=agent.readiness,
        limits=limits,
        routes="probes",
    )

    async def serve(stop: asyncio.Event) -> None:
        await listen(server, "health_port")
        async with server:
            log.info("probes-listening", url=server.base_url)
            await stop.wait()

    agent.hooks.services.append(serve)
    return server


def _evictor(client: AsyncClient | None) -> Callable[[str, str], Awaitable[bool]] | None:
    if client is None:
        return None
    from gpuslice.k8s import PodEvictor

    return PodEvictor(client).evict


def _pod_events(client: AsyncClient | None, settings: AgentSettings) -> Any:
    if client is None:
        return None
    from gpuslice.k8s import PodEvents

    return PodEvents(client, settings.node_name, agent=agent_pod(settings)).post


def agent_pod(settings: AgentSettings) -> AgentPod | None:
    """The agent's own Pod, which its Events are about; None outside a pod."""
    from gpuslice.k8s import AgentPod

    if not settings.pod_name:
        return None
    uid = own_pod_uid(given=settings.pod_uid)
    return AgentPod(settings.namespace, settings.pod_name, str(uid) if uid else None)


@dataclass(frozen=True, slots=True)
class WiredCaps:
    """Memory caps as wired at start: each GPU's capability (found once) and the caps loop,
    None where nothing can be capped."""

    capabilities: Mapping[str, GpuCapability]
    guard_mode: str
    service: CapsService | None

    def view(self) -> CapsView:
        """What the metrics, `/status` and `top` show: each GPU's protection as it holds
        (capped only where the loop confirmed limits), each capped container's limits and
        why the others are not."""
        if self.service is None:
            return caps_view(self.capabilities, self.guard_mode, {}, gpus={})
        applier = self.service.applier
        return caps_view(
            applier.capabilities,
            self.guard_mode,
            applier.readings(),
            applier.windows_s,
            gpus=applier.gpu_states(),
            pending=applier.pending(),
        )


def wire_caps(
    agent: Agent, *, pods: NodePods | None = None, refresher: SnapshotRefresher | None = None
) -> WiredCaps:
    """Memory caps (docs/memory-guard.md): what the node and each GPU allow, found once
    (each refusal logged once), then as the caps loop finds it; in DRA mode the claims'
    CDI specs carry the limits (and the toolkit's hook where it can work), in device
    plugin mode Allocate gives the hook's variables where the toolkit's spec carries the
    hook; in both modes the caps loop applies, checks and repairs each shared container's
    limits. No loop when caps are off or no GPU is capable: the guard then covers every
    GPU as before."""
    settings = agent.settings
    caps_settings = settings.memory_caps
    limiter = memory_limiter_of(agent.backend)
    node = node_capability(settings.cgroup_root)
    inventory = agent.state.current.inventory
    capabilities = gpu_capabilities(inventory, limiter, node, caps_settings.mode)
    capable = any(c.capable for c in capabilities.values())
    hook = None
    if agent.front_end.writes_cdi_specs:
        driver_root = agent.loaded.config.flags.nvidia_driver_root
        program = HookProgram(
            caps_settings.hook_path,
            driver_root,
            node,
            capable,
            seen_at=caps_settings.hook_seen_at,
        )
        program.cdi()  # says at start whether claims get the hook (again when that changes)
        hook = program.cdi
    guard_mode = settings.memory_guard.mode
    if limiter is None or not capable:
        agent.front_end.take_caps(DraCaps(capabilities, caps_settings.policy, hook))
        return WiredCaps(capabilities, guard_mode, None)
    applier = CapsApplier(limiter, capabilities, cgroup_root=settings.cgroup_root)
    # What containers are handed from now on follows the loop: a GPU it refuses or backs
    # off from gets neither the hook's variables (Allocate) nor its limits (a claim's spec).
    agent.front_end.take_caps(DraCaps(applier.hook_capabilities, caps_settings.policy, hook))

    def plan() -> Plan | None:
        current = agent.front_end.attributed_plan()
        return None if current is None else current[0]

    def pids() -> dict[ContainerKey, tuple[int, ...]]:
        snap = refresher.latest if refresher is not None else None
        if snap is None:
            return {}
        return {
            ContainerKey(u.namespace, u.pod, u.container): u.pids for u in snap.attribution.usages
        }

    service = CapsService(
        applier,
        policy=caps_settings.policy,
        current_plan=plan,
        assignments=PodResourcesClient(
            settings.pod_resources_socket,
            dra_driver=None if settings.dra is None else settings.dra.driver_name,
        ),
        pods=(lambda: pod_containers(pods.pods())) if pods is not None else None,
        pids=pids,
        cgroup_root=settings.cgroup_root,
        proc_root=settings.proc_root,
        interval_s=settings.memory_guard.interval_s,
    )
    agent.hooks.services.append(service.run)
    return WiredCaps(capabilities, guard_mode, service)


def wire_guard(
    settings: AgentSettings,
    backend: GpuBackend,
    front: FrontEnd,
    hooks: AgentHooks,
    *,
    pods: NodePods | None = None,
    client: AsyncClient | None = None,
    run_pods: bool = False,
    refresher: SnapshotRefresher | None = None,
    caps: CapsService | None = None,
    mps: MpsDaemonManager | None = None,
) -> MemoryGuard | None:
    """The memory guard (docs/memory-guard.md): refreshes the attribution snapshot it shares
    with the exporter at its own interval (NVML and /proc only while the plan shares a GPU
    by time-slicing or MPS; the exporter then reads that snapshot), evaluates the
    pure policy and acts. `pods` names the pods on a shared GPU (without it several pods on
    one GPU cannot be told apart and nobody is reclaimed); `client` posts Events and
    evictions; `run_pods` starts the pod watch when the metrics exporter does not; `mps`
    terminates an MPS tenant's clients through their server before they are signalled."""
    guard_settings = settings.memory_guard
    if guard_settings.params.mode == "off":
        return None
    shared = (
        refresher if refresher is not None else snapshot_refresher(settings, backend, front, pods)
    )

    mode_of = front.guard_modes(guard_settings.params.mode, guard_settings.claim_override)
    read = guard_view_reader(
        backend,
        front.attributed_plan,
        shared,
        settings.proc_root,
        mode_of=mode_of,
        confirmed=None if caps is None else caps.applier.readings,
    )

    guard = MemoryGuard(
        read=read,
        idle_wait=idle_probe(backend),
        params=guard_settings.params,
        interval_s=guard_settings.interval_s,
        action=guard_settings.action,
        signaller=ProcessSignaller(settings.proc_root, own_pod=own_pod_uid(given=settings.pod_uid)),
        evict=_evictor(client),
        post_event=_pod_events(client, settings),
        terminate_mps_clients=None if mps is None else mps.terminate_clients,
    )
    hooks.services.append(guard.run)
    if run_pods and pods is not None:
        hooks.services.append(pods.run)
    return guard


def _labels_now(agent: Agent) -> dict[str, str]:
    snap = agent.state.current
    no_stamp = agent.settings.no_timestamp or agent.loaded.config.flags.gfd.no_timestamp
    return gfd_labels(
        snap.inventory,
        snap.plan,
        timestamp=None if no_stamp else int(time.time()),
        machine_type=snap.inventory.machine_type,
    )


def _label_interval(agent: Agent) -> float:
    """`flags.gfd.sleepInterval` (60 s by default; "infinite" means only on changes)."""
    interval = agent.loaded.config.flags.gfd.sleep_interval
    return 3600.0 if math.isinf(interval) or interval <= 0 else interval


def _wire_labels(
    agent: Agent,
    publish: Callable[[dict[str, str]], Awaitable[None]],
    retract: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Publish the GFD labels on every plan put in force and every `sleepInterval` (the
    timestamp moves); `retract` them on shutdown where the output mode says so."""

    async def on_plan(_plan: Plan, _inventory: Inventory) -> None:
        await publish(_labels_now(agent))

    async def refresh(stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _label_interval(agent))
                if not stop.is_set():
                    await publish(_labels_now(agent))
        finally:
            if retract is not None:
                await retract()

    agent.hooks.on_plan.append(on_plan)
    agent.hooks.services.append(refresh)


def wire_label_file(agent: Agent, path: Path | None) -> None:
    """GFD's classic output: an NFD local feature file, replaced atomically, removed on
    shutdown as GFD does (NFD then drops the labels)."""

    def target() -> Path:
        if path is not None:
            return path
        return Path(agent.loaded.config.flags.gfd.output_file)

    def write(labels: dict[str, str]) -> None:
        where = target()
        try:
            if LabelFile(where).write(labels):
                log.info("labels-written", path=str(where), count=len(labels))
        except OSError as exc:  # a read-only host path must not take the device plugin down
            log.error("labels-write-failed", path=str(where), error=str(exc))

    async def publish(labels: dict[str, str]) -> None:
        await asyncio.to_thread(write, labels)

    async def retract() -> None:
        await asyncio.to_thread(LabelFile(target()).remove)

    _wire_labels(agent, publish, retract)


def wire_label_api(agent: Agent, labeler: NodeLabeler) -> None:
    """Patch the Node's labels directly (no NFD needed); only labels we wrote are touched.
    They stay on shutdown: a restarting agent would otherwise make them flap."""

    async def publish(labels: dict[str, str]) -> None:
        try:
            await labeler.apply(labels)
        except Exception:
            # the API server being unreachable must not take the device plugin down
            log.exception("labels-patch-failed")

    _wire_labels(agent, publish)


def wire_events(agent: Agent, events: NodeEvents) -> None:
    """A rejected config is posted as a Warning Event on the Node, where
    `kubectl describe node` shows it next to the label that asked for it."""

    async def on_config(name: str, accepted: bool, message: str) -> None:
        if accepted:
            await events.post("ConfigApplied", message, type="Normal")
        else:
            await events.post(
                "ConfigRejected",
                f"config {name!r} refused, previous plan kept: {message}",
                type="Warning",
            )

    agent.hooks.on_config.append(on_config)


def wire_cordon_events(agent: Agent, events: NodeEvents) -> None:
    """The operator's GPU cordon, answered on the Node where it was set: which GPUs are
    cordoned now (Normal), and any entry that named nothing here (Warning)."""

    async def on_cordon(before: Cordon, after: Cordon) -> None:
        if after.devices != before.devices:
            if after.names:
                message = f"cordoned by {CORDON_ANNOTATION}: {', '.join(after.names)}"
                await events.post("GpuCordoned", message, type="Normal")
            else:
                await events.post("GpuCordonLifted", "no GPU is cordoned now", type="Normal")
        if after.problems and after.problems != before.problems:
            await events.post("GpuCordonEntrySkipped", "; ".join(after.problems), type="Warning")

    agent.hooks.on_cordon.append(on_cordon)


@asynccontextmanager
async def build_agent(settings: AgentSettings) -> AsyncIterator[Agent]:
    """Open the node, put the first plan in force, then wire its front end and adapters
    to the plan state: nothing is wired to a plan that does not exist yet."""
    for problem in settings.problems():  # the CLI refused these already; code callers too
        raise GpusliceError(problem)
    backend = await asyncio.to_thread(
        open_backend, settings.node, control_dir=settings.sim_control_dir
    )
    watcher_task: asyncio.Task[None] | None = None
    client: AsyncClient | None = None
    try:
        labels: asyncio.Queue[str] | None = None
        cordons: asyncio.Queue[str] | None = None
        if settings.node_name:
            from gpuslice.k8s import NodeLabelWatcher, make_client

            client = make_client(settings.kubeconfig)
            labels = asyncio.Queue()
            cordons = asyncio.Queue()
            watcher = NodeLabelWatcher(
                client,
                settings.node_name,
                settings.node_label,
                annotation_key=CORDON_ANNOTATION,
                on_annotation=cordons.put_nowait,
            )
            watcher_task = asyncio.create_task(watcher.feed(labels), name="node-label-watch")
        first = await first_plan(settings, backend, label_values=labels, cordon_values=cordons)
        yield await _wire(settings, backend, first, client, labels, cordons)
    finally:
        if watcher_task is not None:
            watcher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher_task
        if client is not None:
            await client.close()
        await asyncio.to_thread(backend.close)


async def _wire(
    settings: AgentSettings,
    backend: GpuBackend,
    first: FirstPlan,
    client: AsyncClient | None,
    labels: asyncio.Queue[str] | None,
    cordons: asyncio.Queue[str] | None,
) -> Agent:
    """The agent with its front end and every adapter the settings ask for."""
    state = plan_state(first)
    events: NodeEvents | None = None
    warn = None
    if client is not None:
        from gpuslice.k8s import NodeEvents

        events = NodeEvents(client, settings.node_name, "default", agent=agent_pod(settings))
        warn = _warner(events)
    front: FrontEnd
    mps: MpsDaemonManager | None = None
    if settings.dra is not None:
        from gpuslice.k8s.claimevents import ClaimEvents
        from gpuslice.k8s.dra import DraApi

        assert client is not None  # AgentSettings.problems: DRA needs the node's name
        objects = DraApi(client, settings.node_name, settings.dra.driver_name)
        flags = first.loaded.config.config.flags
        dra = dra_front_end(
            state,
            settings,
            settings.dra,
            objects,
            warn=warn,
            claim_warn=_claim_warner(ClaimEvents(client, settings.node_name)),
            backend=backend,
            driver_roots=DriverRoots(
                flags.plugin.container_driver_root,
                flags.nvidia_driver_root,
                settings.memory_caps.hook_path,
                settings.memory_caps.hook_seen_at,
            ),
        )
        front, mps = dra, dra.mps
    else:
        front = DevicePluginFrontEnd(state, settings)
    agent = Agent(
        settings, backend, state, first, front, label_values=labels, cordon_values=cordons
    )
    if events is not None:
        wire_events(agent, events)
        wire_cordon_events(agent, events)
    if settings.dra is None:
        mps = wire_mps(
            state,
            agent.hooks,
            agent.set_withdrawn,
            control=settings.mps_control,
            set_compute_mode=settings.set_compute_mode,
            nvidia_smi=settings.nvidia_smi,
            timings=MpsTimings(health_interval_s=settings.mps_health_interval_s),
            shm_tmpfs=settings.mps_shm_tmpfs,
        )
    metrics_on = settings.metrics_port is not None
    node_pods = None
    if client is not None:
        from gpuslice.k8s import NodePods

        node_pods = NodePods(client, settings.node_name)
    refresher = snapshot_refresher(settings, backend, front, node_pods)
    caps = wire_caps(agent, pods=node_pods, refresher=refresher)
    guard = wire_guard(
        settings,
        backend,
        front,
        agent.hooks,
        pods=node_pods,
        client=client,
        run_pods=not (metrics_on and settings.gpu_metrics),
        refresher=refresher,
        caps=caps.service,
        mps=mps,
    )
    pods_running = (metrics_on and settings.gpu_metrics) or guard is not None
    if caps.service is not None and node_pods is not None and not pods_running:
        agent.hooks.services.append(node_pods.run)  # the caps loop reads the pod watch
    if settings.metrics_port is not None:
        wire_metrics(
            agent,
            port=settings.metrics_port,
            host=settings.metrics_address,
            pods=node_pods,
            guard=guard,
            caps=caps,
            mps=mps,
            gpu_metrics=settings.gpu_metrics,
            refresher=refresher,
            limits=ServerLimits(
                head_timeout_s=settings.http_head_timeout_s,
                max_per_address=settings.http_max_per_address,
            ),
        )
    if settings.health_port is not None:
        wire_probes(
            agent,
            port=settings.health_port,
            host=settings.metrics_address,
            limits=replace(
                PROBE_LIMITS,
                head_timeout_s=settings.http_head_timeout_s,
                max_per_address=min(PROBE_LIMITS.max_per_address, settings.http_max_per_address),
            ),
        )
    if settings.labels_mode == "file":
        wire_label_file(agent, settings.labels_file)
    elif settings.labels_mode == "api" and client is not None:
        from gpuslice.k8s import NodeLabeler

        wire_label_api(agent, NodeLabeler(client, settings.node_name))
    agent.hooks.services.append(inventory_watcher(agent, warn))
    return agent


def _claim_warner(events: ClaimEvents) -> ClaimWarn:
    """A Warning Event about the claim, in its namespace (what its author reads)."""

    async def warn(ref: ClaimRef, reason: str, message: str) -> None:
        await events.post(ref.namespace, ref.name, ref.uid, reason, message)

    return warn


def _warner(events: NodeEvents) -> Callable[[str, str], Awaitable[None]]:
    """A Warning Event on the Node (what the DRA driver and the inventory watch post)."""

    async def warn(reason: str, message: str) -> None:
        await events.post(reason, message, type="Warning")

    return warn
