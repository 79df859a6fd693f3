"""DRA mode's front end: what serves the node's GPUs to the kubelet instead of device plugins.

It loads the prepared-claims record before anything can call Prepare, runs the claims' MPS
daemons, keeps the ResourceSlices published and serves `dra.sock` plus the plugin-watcher
registration, with the devices' health streamed to the kubelet from the plan state (the
same unhealthy set and last XIDs that taint the slices). The agent around it is the same
as in device-plugin mode (inventory, health, config reloads, labels, metrics), so a node
switches modes with one flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuslice.agent.dra_driver import DraCaps, DraDriver
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.agent.front import ModeOf
from gpuslice.agent.guard_view import claim_modes
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.health import DeviceHealthReport, device_health
from gpuslice.core.dra.publish import DraDevice
from gpuslice.core.guard.model import ClaimOverride, GuardMode
from gpuslice.core.sharing.model import Plan
from gpuslice.dra.server import DraPluginServer, DraServerSettings
from gpuslice.kubelet.servicer import AllocateObserver
from gpuslice.mps import MpsDaemonManager
from gpuslice.state import PlanState, Snapshot


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
        devices: Callable[[Snapshot], Sequence[DraDevice]] | None = None,
    ) -> None:
        """`devices`: the node's devices as published (the driver's, with dynamic MIG
        partitions); `dra_devices` when None."""
        self._state = state
        self._pool = pool
        self._devices = devices

    def current(self) -> tuple[int, Sequence[DeviceHealthReport]]:
        snap = self._state.current
        devices = None if self._devices is None else self._devices(snap)
        reports = device_health(
            snap.inventory,
            snap.unhealthy,
            snap.last_xid,
            pool=self._pool,
            devices=devices,
            unmonitored=snap.unmonitored,
        )
        return snap.version, reports

    async def wait_newer(self, version: int) -> Snapshot:
        return await self._state.wait_newer(version)


class DraFrontEnd:
    """The `agent.front.FrontEnd` of DRA mode."""

    advises_mig_strategy = False
    writes_cdi_specs = True

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
    ) -> None:
        self._state = state
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

    def take_caps(self, caps: DraCaps) -> None:
        """Claims prepared from now on carry the limits (and the hook) in their CDI specs."""
        self.driver.caps = caps

    def guard_modes(self, node: GuardMode, override: ClaimOverride) -> ModeOf:
        return claim_modes(self.driver, node, override)
