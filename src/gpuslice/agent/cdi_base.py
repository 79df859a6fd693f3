"""The node's base CDI spec (`core.cdi.driver`), kept in step with the node for DRA claims.

Written before the first Prepare answers and again when a snapshot with another inventory
(the driver version with it) or dev root is published (`BaseSpec.follow`) or prepared
with, atomically and under the same name, so the IDs a prepared claim returned keep
resolving across restarts; it is never removed (a claim prepared earlier may still name
it). Where the driver's files or the toolkit's hook program cannot
be found (no driver root mounted, a simulated node), no base spec is written and claims
carry `NVIDIA_VISIBLE_DEVICES` with their GPUs as before: the toolkit's legacy hook then
injects the libraries, and a container with two claims sees only the last one's GPUs. That
is logged once per reason, naming what is missing.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from gpuslice.aio.waiting import unless_stopped
from gpuslice.core.cdi.driver import BASE_ID, BASE_KIND, BASE_SPEC, base_spec
from gpuslice.core.devices import Inventory
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.devroot import container_dev_root
from gpuslice.host.driverfiles import find_driver_files
from gpuslice.logs import get_logger
from gpuslice.state import PlanState, Snapshot

log = get_logger("gpuslice.dra.cdi")


@dataclass(frozen=True, slots=True)
class DriverRoots:
    """The driver root as the agent sees it (`containerDriverRoot`) and on the host
    (`nvidiaDriverRoot`), and the toolkit's hook program as the runtime runs it
    (`--memory-caps-hook-path`) and where the agent sees it (`--memory-caps-hook-seen-at`)."""

    container_driver_root: str
    host_driver_root: str
    hook_path: str
    hook_seen_at: str = ""


class BaseSpec:
    def __init__(self, cdi_root: Path, roots: DriverRoots) -> None:
        self._store = CdiSpecStore(cdi_root, BASE_KIND)
        self._roots = roots
        self._lock = asyncio.Lock()
        self._written: tuple[Inventory, str] | None = None
        self._id: str | None = None
        self._said = ""

    @property
    def last(self) -> str | None:
        """The ID the last write gave (what a claim prepared since then returned)."""
        return self._id

    async def cdi_id(self, snap: Snapshot | None) -> str | None:
        """The base spec's CDI ID for a claim prepared now (written first when the node
        changed since the last write, looked for again while it could not be written);
        None: claims name their GPUs in the environment."""
        if snap is None:
            return self._id
        async with self._lock:
            key = (snap.inventory, snap.host_dev_root)
            if key != self._written or self._id is None:
                self._id = await asyncio.to_thread(self._write, snap)
                self._written = key
            return self._id

    async def follow(self, stop: asyncio.Event, state: PlanState) -> None:
        """Keep the spec in step with every snapshot published until `stop`: a driver
        upgraded while the agent runs (a new inventory) or a new dev root rewrites it now,
        not at the next Prepare, so a container of a claim prepared earlier that starts
        again meanwhile gets the new driver's files, not the old one's."""
        version = 0  # none seen: the current snapshot first
        while (snap := await unless_stopped(stop, state.wait_newer(version))) is not None:
            version = snap.version
            await self.cdi_id(snap)

    def _write(self, snap: Snapshot) -> str | None:
        roots = self._roots
        missing = self._hook_missing()
        files = find_driver_files(
            roots.container_driver_root,
            snap.inventory.driver_version,
            container_dev_root(roots.container_driver_root),
        )
        missing = ", ".join(m for m in (files.missing(), missing) if m)
        if missing:
            if missing != self._said:
                self._said = missing
                log.warning(
                    "dra-cdi-base-missing",
                    missing=missing,
                    driver_root=roots.container_driver_root,
                    then="claims set NVIDIA_VISIBLE_DEVICES to their GPUs: a container with "
                    "two claims sees only the last claim's GPUs",
                )
            return None
        spec = base_spec(
            files,
            host_driver_root=roots.host_driver_root,
            host_dev_root=snap.host_dev_root,
            hook_path=roots.hook_path,
        )
        try:
            path = self._store.write(BASE_SPEC, spec)
        except OSError as exc:
            log.warning("dra-cdi-base-unwritten", error=str(exc))
            self._said = ""
            return None
        if self._said != "written":
            self._said = "written"
            log.info(
                "dra-cdi-base-written",
                path=str(path),
                libraries=len(files.libraries),
                version=files.version,
            )
        return BASE_ID

    def _hook_missing(self) -> str:
        """The toolkit's hook program, which links and caches the mounted libraries: the
        base spec is not written without it (its containers would lack `libcuda.so.1`)."""
        roots = self._roots
        if not roots.hook_path:
            return "nvidia-cdi-hook (--memory-caps-hook-path '')"
        seen = Path(roots.hook_seen_at or roots.hook_path)
        if not (seen.is_file() and os.access(seen, os.X_OK)):
            return f"nvidia-cdi-hook at {seen}"
        return ""
