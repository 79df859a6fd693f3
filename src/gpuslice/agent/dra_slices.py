"""Keeping this node's ResourceSlices equal to what it can offer.

Published on start, on every change of the plan in force (inventory, MIG layout, config:
which GPUs are offered as shares) and of health (taints), and checked again every resync
interval: the kubelet deletes every slice of its node when it starts, and 30 s after a
driver's socket went away, so slices that vanish must come back without waiting for a
change. The comparison that decides whether anything must be written is the core's
(`core.dra.publish.plan_slices`); what the API last returned is remembered, so slices the
server stored in its own spelling are not rewritten at every resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuslice.core.dra.publish import (
    Health,
    SliceChanges,
    device_json,
    dra_devices,
    plan_slices,
    share_offers,
    taints,
)
from gpuslice.kubelet.state import PlanState, Snapshot
from gpuslice.logs import get_logger
from gpuslice.ports import DraConflict, DraObjectNotFound, DraObjects

log = get_logger("gpuslice.dra.slices")
Json = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SlicePublisher:
    def __init__(
        self,
        objects: DraObjects,
        *,
        driver: str,
        node: str,
        snapshot: Callable[[], Snapshot | None],
        xids: Callable[[], Mapping[str, int | None]] = dict,
        resync_s: float = 10.0,
    ) -> None:
        self._objects = objects
        self.driver = driver
        self.node = node
        self._snapshot = snapshot
        self._xids = xids
        self.resync_s = resync_s
        self._tainted_since: dict[str, str] = {}
        self._node_uid: str | None = None
        self._stored: tuple[tuple[str, str], ...] | None = None
        """(name, resourceVersion) of the slices as we last left them."""
        self._wanted: list[Json] | None = None
        self.published = asyncio.Event()
        self.publishes = 0
        """Writes made (create, replace, delete): what the benchmark and tests count."""
        self.last_error = ""

    def wanted_devices(self, snap: Snapshot) -> list[Json]:
        offers = share_offers(snap.plan)
        xids = self._xids()
        unhealthy = {u: xids.get(u) for u in snap.unhealthy}
        for uuid in list(self._tainted_since):
            if uuid not in unhealthy:
                del self._tainted_since[uuid]
        for uuid in unhealthy:
            self._tainted_since.setdefault(uuid, _now())
        health = Health(unhealthy)
        out = []
        for device in dra_devices(snap.inventory):
            since = self._tainted_since.get(device.uuid) or self._tainted_since.get(
                device.gpu.uuid, ""
            )
            device_taints = taints(device, health, self.driver, since)
            out.append(device_json(device, device_taints, offers.get(device.uuid)))
        return out

    async def publish_once(self) -> SliceChanges:
        """Make the API hold what should be published; the changes made (empty: none)."""
        snap = self._snapshot()
        if snap is None:
            return SliceChanges((), (), ())
        wanted = self.wanted_devices(snap)
        if self._node_uid is None:
            try:
                self._node_uid = await self._objects.node_uid()
            except DraObjectNotFound:
                self._node_uid = ""
        for attempt in range(3):
            existing = await self._objects.list_slices()
            stored = _identity(existing)
            if wanted == self._wanted and stored == self._stored:
                return SliceChanges((), (), ())
            changes = plan_slices(
                existing, wanted, driver=self.driver, node=self.node, node_uid=self._node_uid
            )
            try:
                written = await self._apply(changes)
            except DraConflict:
                if attempt == 2:
                    raise
                continue  # someone else wrote meanwhile: read again and plan again
            # a change rewrites every slice that stays (plan_slices), so the replies are the
            # pool as it now is: no second list
            after = written if not changes.empty else existing
            self._stored, self._wanted = _identity(after), wanted
            self._check_dropped(written)
            self.published.set()
            return changes
        raise AssertionError("unreachable")

    async def _apply(self, changes: SliceChanges) -> list[Json]:
        written: list[Json] = []
        for name in changes.delete:
            with contextlib.suppress(DraObjectNotFound):
                await self._objects.delete_slice(name)
            self.publishes += 1
        for obj in changes.update:
            written.append(await self._objects.replace_slice(obj))
            self.publishes += 1
        for obj in changes.create:
            written.append(await self._objects.create_slice(obj))
            self.publishes += 1
        if not changes.empty:
            log.info(
                "dra-slices-published",
                created=len(changes.create),
                updated=len(changes.update),
                deleted=len(changes.delete),
                generation=_generation(written),
            )
        return written

    def _check_dropped(self, written: list[Json]) -> None:
        """An API server without DRAConsumableCapacity drops `allowMultipleAllocations`:
        the shared GPUs are then offered whole, which the operator must hear about."""
        for obj in written:
            for device in (obj.get("spec") or {}).get("devices") or []:
                capacity = device.get("capacity") or {}
                if "shares" in capacity and not device.get("allowMultipleAllocations"):
                    log.warning(
                        "dra-shares-dropped",
                        device=device.get("name"),
                        message="the API server dropped allowMultipleAllocations "
                        "(DRAConsumableCapacity is off): shared GPUs are offered whole",
                    )
                    return

    async def run(self, stop: asyncio.Event, state: PlanState) -> None:
        """Publish on every new snapshot and every resync tick until `stop`."""
        version = -1
        failures = 0
        while not stop.is_set():
            snap = state.current
            try:
                # an API server that hangs must not stop the resync for good
                await asyncio.wait_for(self.publish_once(), max(30.0, 3 * self.resync_s))
                failures = 0
                self.last_error = ""
            except Exception as exc:  # the API server may be away; keep trying
                failures += 1
                self.last_error = str(exc)
                log.warning("dra-slices-publish-failed", error=str(exc), failures=failures)
            version = snap.version
            wait = self.resync_s if failures == 0 else min(self.resync_s, 0.5 * 2**failures)
            await _next_change(stop, state, version, wait)


async def _next_change(stop: asyncio.Event, state: PlanState, version: int, wait: float) -> None:
    deadline = time.monotonic() + wait
    newer = asyncio.ensure_future(state.wait_newer(version))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait(
            {newer, stopped},
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for task in (newer, stopped):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _identity(objs: list[Json]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (
                str(o.get("metadata", {}).get("name")),
                str(o.get("metadata", {}).get("resourceVersion")),
            )
            for o in objs
        )
    )


def _generation(objs: list[Json]) -> int | None:
    for o in objs:
        pool = (o.get("spec") or {}).get("pool") or {}
        if "generation" in pool:
            return int(pool["generation"])
    return None
