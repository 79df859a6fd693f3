"""DRA mode's front end: what serves the node's GPUs to the kubelet instead of device plugins.

It loads the prepared-claims record before anything can call Prepare, runs the claims' MPS
daemons, keeps the ResourceSlices published and serves `dra.sock` plus the plugin-watcher
registration. The agent around it is the same as in device-plugin mode (inventory, health,
config reloads, labels, metrics), so a node switches modes with one flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from gpuslice.agent.dra_driver import DraDriver
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.dra.server import DraPluginServer, DraServerSettings
from gpuslice.kubelet.state import PlanState
from gpuslice.mps import MpsDaemonManager


class DraFrontEnd:
    def __init__(
        self,
        state: Callable[[], PlanState | None],
        *,
        driver_name: str,
        plugin_dir: Path,
        registry_dir: Path,
        driver: DraDriver,
        publisher: SlicePublisher,
        mps: MpsDaemonManager | None = None,
        server_settings: DraServerSettings | None = None,
    ) -> None:
        self._state = state
        self.driver_name = driver_name
        self.plugin_dir = plugin_dir
        self.registry_dir = registry_dir
        self.driver = driver
        self.publisher = publisher
        self.mps = mps
        self._server_settings = server_settings
        self.server: DraPluginServer | None = None

    async def run(self, stop: asyncio.Event) -> None:
        state = self._state()
        assert state is not None, "the front end runs once a plan is in force"
        # Prepare must see the record of earlier preparations before the kubelet can call.
        await self.driver.load()
        self.server = DraPluginServer(
            self.driver_name,
            self.plugin_dir,
            self.registry_dir,
            self.driver,
            settings=self._server_settings,
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
