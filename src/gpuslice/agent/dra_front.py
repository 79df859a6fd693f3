"""DRA mode's front end: what serves the node's GPUs to the kubelet instead of device plugins.

It loads the prepared-claims record before anything can call Prepare, runs the claims' MPS
daemons, keeps the ResourceSlices published and serves `dra.sock` plus the plugin-watcher
registration, with the devices' health streamed to the kubelet from the plan state (the
same unhealthy set and last XIDs that taint the slices). The agent around it is the same
as in device-plugin mode (inventory, health, config reloads, labels, metrics), so a node
switches modes with one flag. `KIND` registers it (`agent.front_ends`): chosen when the
settings carry DRA's group (`--dra`), built by `dra_front_end`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuslice.agent.cdi_base import BaseSpec, DriverRoots
from gpuslice.agent.dra_driver import ClaimWarn, DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.agent.dynamic_mig import JOURNAL_NAME as DYNAMIC_MIG_RECORD
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.agent.front import FrontEndKind, FrontEndParts, ModeOf
from gpuslice.agent.guard_view import claim_modes
from gpuslice.agent.settings import AgentSettings, DraSettings
from gpuslice.core.caps import ContainerCaps
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.health import DeviceHealthReport, device_health
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import DraDevice
from gpuslice.core.guard.model import ClaimOverride, GuardMode
from gpuslice.core.sharing.model import Plan
from gpuslice.dra.server import DraPluginServer, DraServerSettings
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import (
    CHECKPOINT_NAME,
    OLD_CHECKPOINT_NAME,
    CheckpointFile,
    boot_id,
)
from gpuslice.host.hostdirs import readable_if_present, writable_dir
from gpuslice.kubelet.servicer import AllocateObserver
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.mps.shm import ShmMounts
from gpuslice.nvsmi import NvidiaSmi
from gpuslice.podresources import PodResourcesClient
from gpuslice.ports import DraObjects, GpuBackend, MigPartitioner
from gpuslice.state import PlanState, Snapshot

if TYPE_CHECKING:
    from gpuslice.agent.runner import Agent
    from gpuslice.k8s.claimevents import ClaimEvents


class PlanHealth:
    """The DRA health stream's source: every published device's health from the plan state.

    A new snapshot (health change, reload) wakes the stream; the last XID per GPU only
    explains an unhealthy device, and the agent publishes it in the snapshot that marks
    the device. Computed afresh at each send: a few devices, every few seconds.
    """

    def __init__(
        self,
        state: PlanState,
        *,
        pool: str,
        devices: Callable[[Snapshot], Sequence[DraDevice]],
    ) -> None:
        """`devices`: the node's devices as published (the driver's, with dynamic MIG
        partitions)."""
        self._state = state
        self._pool = pool
        self._devices = devices

    def current(self) -> tuple[int, Sequence[DeviceHealthReport]]:
        snap = self._state.current
        reports = device_health(
            snap.inventory,
            snap.unhealthy,
            snap.last_xid,
            pool=self._pool,
            devices=self._devices(snap),
            unmonitored=snap.unmonitored,
        )
        return snap.version, reports

    async def wait_newer(self, version: int) -> Snapshot:
        return await self._state.wait_newer(version)


class DraFrontEnd:
    """The `agent.front.FrontEnd` of DRA mode."""

    def __init__(
        self,
        state: PlanState,
        *,
        driver_name: str,
        plugin_dir: Path,
        registry_dir: Path,
        driver: DraDriver,
        publisher: SlicePublisher,
        mps: MpsDaemonManager | None = None,
        server_settings: DraServerSettings | None = None,
        node_name: str = "",
        base: BaseSpec | None = None,
    ) -> None:
        """`base`: the node's base CDI spec the driver returns, kept in step with the
        snapshots; None where the node has none."""
        self._state = state
        self.base = base
        self.driver_name = driver_name
        self.plugin_dir = plugin_dir
        self.registry_dir = registry_dir
        self.driver = driver
        self.publisher = publisher
        self.mps = mps
        self._server_settings = server_settings
        self.node_name = node_name
        """The pool of this node's devices; "" serves no health stream."""
        self.server: DraPluginServer | None = None
        self.on_allocate: AllocateObserver | None = None
        """Unused: DRA has no Allocate (Prepare's counters are the driver's own)."""

    async def run(self, stop: asyncio.Event) -> None:
        state = self._state
        # Prepare must see the record of earlier preparations before the kubelet can call.
        await self.driver.load()
        self.server = DraPluginServer(
            self.driver_name,
            self.plugin_dir,
            self.registry_dir,
            self.driver,
            settings=self._server_settings,
            health=PlanHealth(state, pool=self.node_name, devices=self.driver.devices)
            if self.node_name
            else None,
        )
        async with asyncio.TaskGroup() as tg:
            if self.mps is not None:
                tg.create_task(self.mps.run(stop), name="dra-mps")
            tg.create_task(self.publisher.run(stop, state), name="dra-slices")
            if self.base is not None:
                tg.create_task(self.base.follow(stop, state), name="dra-cdi-base")
            tg.create_task(self.server.run(stop), name="dra-server")

    def readiness(self) -> tuple[bool, str]:
        if not self.driver.loaded or self.server is None:
            return False, "DRA driver starting (reading its checkpoint)\n"
        status = self.server.status
        if not status.registered.is_set():
            why = f": {status.error}" if status.error else " yet"
            return False, f"DRA driver not registered with the kubelet{why}\n"
        if not self.publisher.published.is_set():
            error = self.publisher.last_error or "not yet"
            return False, f"ResourceSlices not published: {error}\n"
        return True, "ok\n"

    def attributed_plan(self) -> tuple[Plan, Inventory] | None:
        claims = self.driver.claims_plan()
        return None if claims is None else (claims, self._state.current.inventory)

    def take_caps(self, caps: ContainerCaps) -> None:
        """Claims prepared from now on carry the limits (and the hook) in their CDI specs;
        asked for the hook now, it says at start whether claims get it (and again when
        that changes)."""
        caps.hook_now()
        self.driver.caps = caps

    def guard_modes(self, node: GuardMode, override: ClaimOverride) -> ModeOf:
        return claim_modes(self.driver, node, override)

    def plan_warnings(self, plan: Plan) -> tuple[str, ...]:
        """Without the advice about `migStrategy`: DRA publishes MIG devices whatever the
        device plugin's setting says."""
        return tuple(w for w in plan.warnings if w not in plan.mig_strategy_warnings)

    def assignments(self, socket: Path) -> PodResourcesClient:
        """Claims of this driver hold their devices in PodResources' dynamic resources."""
        return PodResourcesClient(socket, dra_driver=self.driver_name)

    def wire_mps(self, agent: Agent) -> MpsDaemonManager | None:
        """The claims' daemons, which the front end runs itself; the plan's are not wired
        in this mode, so the two never start daemons on one GPU."""
        return self.mps


@dataclass(frozen=True, slots=True)
class _PlanDynamic:
    """The GPUs the plan in force leaves to dynamic MIG, asked at each use."""

    state: PlanState

    def __call__(self) -> tuple[str, ...]:
        return self.state.snapshot().plan.dynamic_mig


def dra_front_end(
    state: PlanState,
    settings: AgentSettings,
    dra: DraSettings,
    objects: DraObjects,
    *,
    warn: Callable[[str, str], Awaitable[None]] | None = None,
    claim_warn: ClaimWarn | None = None,
    server_settings: DraServerSettings | None = None,
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
        timings=MpsTimings(health_interval_s=settings.mps_health_interval_s),
        keep_running=True,  # claims' pods outlive an agent restart; so do their daemons
        shm=ShmMounts() if settings.mps_shm_tmpfs else None,
    )
    dynamic = _PlanDynamic(state)
    partitioner = backend if isinstance(backend, MigPartitioner) else None
    dynamic_mig = (
        None
        if partitioner is None
        else DynamicMig(
            partitioner, CheckpointFile(plugin_dir / DYNAMIC_MIG_RECORD), boot_id(), warn=warn
        )
    )
    base = None if driver_roots is None else BaseSpec(dra.cdi_root, driver_roots)
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
        timeslice=smi,
        warn=warn,
        claim_warn=claim_warn,
        old_checkpoint=CheckpointFile(plugin_dir / OLD_CHECKPOINT_NAME),
        dynamic_mig=dynamic_mig,
        dynamic=dynamic,
        compute_mode=smi if settings.set_compute_mode else None,
        base=base,
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
        base=base,
    )


@dataclass(frozen=True, slots=True)
class _ClaimWarner:
    """A Warning Event about the claim, in its namespace (what its author reads)."""

    events: ClaimEvents

    async def __call__(self, ref: ClaimRef, reason: str, message: str) -> None:
        await self.events.post(ref.namespace, ref.name, ref.uid, reason, message)


def _dra_settings(settings: AgentSettings) -> DraSettings:
    assert settings.dra is not None  # only asked of the kind the settings selected
    return settings.dra


def _selected(settings: AgentSettings) -> bool:
    return settings.dra is not None


def _build(parts: FrontEndParts) -> DraFrontEnd:
    """The daemon's DRA front end, on the API server (`k8s.dra.DraApi`)."""
    from gpuslice.k8s.claimevents import ClaimEvents
    from gpuslice.k8s.dra import DraApi

    settings = parts.settings
    dra = _dra_settings(settings)
    client = parts.client
    assert client is not None  # AgentSettings.problems: DRA needs the node's name
    return dra_front_end(
        parts.state,
        settings,
        dra,
        DraApi(client, settings.node_name, dra.driver_name),
        warn=parts.warn,
        claim_warn=_ClaimWarner(ClaimEvents(client, settings.node_name)),
        backend=parts.backend,
        driver_roots=DriverRoots(
            parts.flags.plugin.container_driver_root,
            parts.flags.nvidia_driver_root,
            settings.memory_caps.hook_path,
            settings.memory_caps.hook_seen_at,
        ),
    )


def _lock_dir(settings: AgentSettings) -> Path:
    return _dra_settings(settings).plugin_path


def check_host_dirs(settings: AgentSettings) -> None:
    """DRA mode's directories, checked before they are used, so that missing rights are
    one line naming the directory (`HostDirError`), not a traceback from whichever task
    met them first."""
    dra = _dra_settings(settings)
    plugin = dra.plugin_path
    writable_dir(plugin, "DRA plugin directory (--dra-plugin-dir / DRA_PLUGIN_DIR)")
    writable_dir(
        dra.registry_dir,
        "kubelet plugin registry directory (--dra-registry-dir / DRA_REGISTRY_DIR)",
        create=False,  # the kubelet's own: one we made would be watched by nobody
    )
    writable_dir(dra.cdi_root, "CDI spec directory (--cdi-root / CDI_ROOT)")
    writable_dir(plugin / "mps", "MPS directory of DRA claims")
    readable_if_present(plugin / CHECKPOINT_NAME, "DRA checkpoint")


KIND = FrontEndKind(
    name="dra",
    selected=_selected,
    build=_build,
    lock_dir=_lock_dir,
    check_host_dirs=check_host_dirs,
)
