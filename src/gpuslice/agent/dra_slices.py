"""Keeping this node's ResourceSlices equal to what it can offer.

Published on start, on every change of the plan in force (inventory, MIG layout, config:
which GPUs are offered as shares) and of health (taints), and whenever the slices change
under it: the kubelet deletes every slice of its node when it starts, and 30 s after a
driver's socket went away, so slices that vanish must come back at once.

The slices are known from a watch, not from polling: one LIST, then a watch with bookmarks
resumed from the last resourceVersion whenever the server ends it or the connection drops;
a LIST again only after 410 Gone. A node at rest therefore sends nothing but the watch
re-establishments the server's timeout forces, whatever the number of nodes (a LIST every
few seconds per node costs the API server cores at a few thousand nodes, as each LIST is
filtered over every slice it holds). The comparison that decides whether anything must be
written is the core's (`core.dra.publish.plan_slices`); what the API last returned is
remembered, so slices the server stored in its own spelling, and the watch's echo of the
agent's own writes, are not rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime

from gpuslice.aio.races import first_of
from gpuslice.aio.waiting import unless_stopped
from gpuslice.core.backoff import Backoff
from gpuslice.core.dra.partitions import with_consumption
from gpuslice.core.dra.publish import (
    REPLICAS,
    DraDevice,
    Health,
    SharesMode,
    SliceChanges,
    cordon_taints,
    device_json,
    plan_slices,
    taints,
    unmonitored_taints,
)
from gpuslice.core.dra.resource_slice import StoredSlice, stored_devices
from gpuslice.core.jsontypes import Json
from gpuslice.logs import get_logger
from gpuslice.ports import DraConflict, DraExpired, DraObjectNotFound, DraObjects, SliceEvent
from gpuslice.state import PlanState, Snapshot

log = get_logger("gpuslice.dra.slices")


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
        resync_s: float = 10.0,
        backoff: Backoff | None = None,
        shares: SharesMode = REPLICAS,
        dynamic: Callable[[], Collection[str]] = frozenset,
        ours: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """`resync_s` caps the delay between retries after a failed publish (the API server
        away); at rest nothing is re-read. `dynamic` names the GPUs marked for dynamic MIG
        (`core.dra.partitions.is_dynamic`), `ours` the MIG devices gpuslice created on them
        (`agent.dynamic_mig`): such a GPU publishes its counter set and partitions."""
        self._objects = objects
        self.driver = driver
        self.node = node
        self._snapshot = snapshot
        self.resync_s = resync_s
        self.shares = shares
        self._tainted_since: dict[str, str] = {}
        self._noticed_since: dict[str, str] = {}
        self._cordoned_since: dict[str, str] = {}
        self._unmonitored_since: dict[str, str] = {}
        self._node_uid: str | None = None
        self._stored: tuple[tuple[str, str], ...] | None = None
        """(name, resourceVersion) of the slices as we last left them."""
        self._wanted: tuple[list[Json], list[Json]] | None = None
        self._dynamic = dynamic
        self._ours = ours
        self._backoff = backoff or Backoff(initial_s=0.2, maximum_s=30.0)
        self._mirror: dict[str, Json] | None = None
        """This node's slices as the watch last showed them (None: not listed yet)."""
        self._moved = asyncio.Event()
        """Set when the watch showed a change (the agent's own writes echoed included)."""
        self.lists = 0
        """Slice LISTs made: one at start, then one per 410 Gone (what tests and benches
        count)."""
        self.rounds = 0
        """Publish rounds run (each compares the wanted slices with the stored ones, writing
        only a difference): tests wait for rounds to prove that nothing was written at rest."""
        self.events = 0
        """Watch events received, the echoes of this publisher's own writes included."""
        self.watches = 0
        """Watch streams opened by this publisher's loop (lightkube re-opens a stream the
        server ended without counting here)."""
        self.published = asyncio.Event()
        self.publishes = 0
        """Writes made (create, replace, delete): what the benchmark and tests count."""
        self.last_error = ""
        self.partitionable = True
        """Whether dynamic MIG GPUs publish partitions: turned off for good when the API
        server drops `consumesCounters` (DRAPartitionableDevices off)."""
        self.informational = True
        """Whether ignored XIDs are published as taints of effect `None`: turned off for
        good when the API server refuses that effect (before Kubernetes 1.35)."""

    def wanted_devices(self, snap: Snapshot) -> list[Json]:
        return self.wanted(snap)[0]

    def wanted(self, snap: Snapshot) -> tuple[list[Json], list[Json]]:
        """The devices and the counter sets this node publishes: the snapshot's offer
        (`core.policy`), with each device's taints."""
        marked = self._dynamic() if self.partitionable else ()
        offer = snap.policy.offer(self.shares, dynamic=marked, ours=self._ours())
        xids = snap.last_xid
        # the agent records an XID against the physical GPU; a MIG device's taint names it
        # too (not `gpu-lost`, which only a GPU without an XID gets)
        parent: dict[str, str] = {
            m.uuid: g.uuid for g in snap.inventory.gpus for m in g.mig_devices
        }
        unhealthy = {u: xids.get(u, xids.get(parent.get(u, ""))) for u in snap.unhealthy}
        for uuid in list(self._tainted_since):
            if uuid not in unhealthy:
                del self._tainted_since[uuid]
        for uuid in unhealthy:
            self._tainted_since.setdefault(uuid, _now())
        noticed = snap.noticed if self.informational else {}
        # effect None, as the informational taints: an API server before 1.35 refuses both
        unwatched = frozenset(snap.unmonitored) if self.informational else frozenset()
        _track(self._noticed_since, noticed)
        _track(self._cordoned_since, snap.cordoned)
        _track(self._unmonitored_since, unwatched)
        health = Health(unhealthy, noticed, snap.cordoned, unwatched)
        out = []
        for device in offer.devices:
            since = _since(self._tainted_since, device) or _since(self._noticed_since, device)
            device_taints = taints(device, health, self.driver, since)
            device_taints += unmonitored_taints(
                device, health, self.driver, _since(self._unmonitored_since, device)
            )
            device_taints += cordon_taints(device, health, _since(self._cordoned_since, device))
            owner = offer.dynamic.get(device.gpu.uuid)
            if owner is not None:
                out.append(with_consumption(device_json(device, device_taints), owner))
            else:
                out.append(device_json(device, device_taints, offer.shares.get(device.uuid)))
        return out, offer.counter_sets()

    async def publish_once(self) -> SliceChanges:
        """Make the API hold what should be published; the changes made (empty: none)."""
        snap = self._snapshot()
        if snap is None:
            return SliceChanges((), (), ())
        wanted = self.wanted(snap)
        if self._node_uid is None:
            try:
                self._node_uid = await self._objects.node_uid()
            except DraObjectNotFound:
                self._node_uid = ""
        for attempt in range(3):
            if self._mirror is not None and attempt == 0:
                existing = list(self._mirror.values())
            else:
                # not watched yet (a one-off publish), or a write lost a race with a writer
                # the watch has not shown yet: read the pool as it is now
                existing = await self._objects.list_slices()
                self.lists += 1
            stored = _identity(existing)
            if wanted == self._wanted and stored == self._stored:
                return SliceChanges((), (), ())
            changes = plan_slices(
                existing,
                wanted[0],
                driver=self.driver,
                node=self.node,
                node_uid=self._node_uid,
                counter_sets=wanted[1],
            )
            try:
                written = await self._apply(changes)
            except DraConflict:
                if attempt == 2:
                    raise
                continue  # someone else wrote meanwhile: read again and plan again
            except Exception as exc:
                if not (self.informational and _refuses_effect_none(exc)):
                    raise
                # a server before 1.35 knows no effect `None`: publish without the
                # informational taints rather than publish nothing at all
                self.informational = False
                log.warning(
                    "dra-informational-taints-refused",
                    error=str(exc)[:500],
                    message="this API server refuses the taint effect None (Kubernetes "
                    "1.35+): ignored XIDs are no longer published as taints",
                )
                wanted = self.wanted(snap)
                continue
            # a change rewrites every slice that stays (plan_slices), so the replies are the
            # pool as it now is: no second list
            after = written if not changes.empty else existing
            self._stored, self._wanted = _identity(after), wanted
            if self._mirror is not None and not changes.empty:
                for name in changes.delete:
                    self._mirror.pop(name, None)
                for obj in written:
                    self._mirror[str(obj["metadata"]["name"])] = obj
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
        the shared GPUs are then offered whole, which the operator must hear about. One
        without DRAPartitionableDevices drops `consumesCounters`: overlapping MIG
        partitions could then be allocated together, so dynamic MIG is withdrawn (its GPUs
        publish the instances they hold, as static ones) and the pool republished."""
        for obj in written:
            for device in stored_devices(obj):
                if self.partitionable and device.partition and not device.consumes_counters:
                    self.partitionable = False
                    self._moved.set()
                    log.error(
                        "dra-counters-dropped",
                        device=device.name,
                        message="the API server dropped consumesCounters "
                        "(DRAPartitionableDevices is off): dynamic MIG is withdrawn, its GPUs "
                        "publish the MIG devices they hold",
                    )
                    break
        for obj in written:
            for device in stored_devices(obj):
                if device.offers_shares and not device.multiple_allocations:
                    log.warning(
                        "dra-shares-dropped",
                        device=device.name,
                        message="the API server dropped allowMultipleAllocations "
                        "(DRAConsumableCapacity is off): shared GPUs are offered whole",
                    )
                    return

    async def run(self, stop: asyncio.Event, state: PlanState) -> None:
        """Watch the slices and publish on every new snapshot and every change the watch
        shows, until `stop`."""
        watching = asyncio.create_task(self._watch_forever(), name="dra-slices-watch")
        try:
            await unless_stopped(stop, self._first_list())
            version = -1
            failures = 0
            while not stop.is_set():
                snap = state.current
                self._moved.clear()
                try:
                    # an API server that hangs must not stop publishing for good
                    await asyncio.wait_for(self.publish_once(), max(30.0, 3 * self.resync_s))
                    failures = 0
                    self.last_error = ""
                except Exception as exc:  # the API server may be away; keep trying
                    failures += 1
                    self.last_error = str(exc)
                    log.warning("dra-slices-publish-failed", error=str(exc), failures=failures)
                self.rounds += 1
                version = snap.version
                if failures == 0:
                    await _next_change(stop, state, version, self._moved, None)
                else:
                    # the watch's echo of this round's own writes (slices written before the
                    # one refused) must not cut the back-off short: a refusal would then be
                    # retried as fast as the server echoes, rewriting every slice each time
                    delay = min(self.resync_s, self._backoff.delay(failures))
                    await _next_change(stop, state, version, None, delay)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    async def _first_list(self) -> None:
        while self._mirror is None:
            await self._moved.wait()
            self._moved.clear()

    async def _watch_forever(self) -> None:
        """Keep `_mirror` equal to the API's view of this node's slices: LIST once, then
        watch from the list's version; resume from the last version seen after any failure;
        LIST again only when the server says that version is gone (410)."""
        version: str | None = None
        delays = self._backoff.delays()
        while True:
            try:
                if version is None:
                    listing = await self._objects.listed_slices()
                    self.lists += 1
                    self._mirror = {str(o["metadata"]["name"]): o for o in listing.items}
                    version = listing.resource_version
                    self._moved.set()
                self.watches += 1
                async for event in self._objects.watch_slices(version):
                    version = event.resource_version or version
                    self.events += 1
                    delays = self._backoff.delays()
                    if self._take(event):
                        self._moved.set()
            except DraExpired:
                log.info("dra-slices-watch-expired", message="listing again")
                version = None
                continue
            except Exception as exc:
                log.warning("dra-slices-watch-failed", error=str(exc))
            await asyncio.sleep(next(delays))

    def _take(self, event: SliceEvent) -> bool:
        """Apply one watch event to the mirror; whether it changed anything."""
        mirror = self._mirror
        if mirror is None or event.kind not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        name = StoredSlice.read(event.obj).name
        if event.kind == "DELETED":
            return mirror.pop(name, None) is not None
        old = mirror.get(name)
        if old is not None and _identity([old]) == _identity([event.obj]):
            return False  # the echo of a write whose reply is already here
        mirror[name] = event.obj
        return True


async def _next_change(
    stop: asyncio.Event,
    state: PlanState,
    version: int,
    moved: asyncio.Event | None,
    retry_s: float | None,
) -> None:
    """Until the plan moves on, the watch shows a change (unless `moved` is None), `stop`,
    or (after a failure) the retry delay: with nothing happening, nothing wakes."""
    waits = [state.wait_newer(version), stop.wait()]
    if moved is not None:
        waits.append(moved.wait())
    await first_of(*waits, within_s=retry_s)


def _refuses_effect_none(exc: Exception) -> bool:
    """The API server's answer to a taint effect it does not know (`Unsupported value:
    "None"`, HTTP 422), as a server before 1.35 gives it."""
    text = str(exc)
    return 'effect: Unsupported value: "None"' in text


def _track(since: dict[str, str], current: Collection[str]) -> None:
    """Keep `since` (UUID -> when its taint came) to the UUIDs in `current`: a taint's
    `timeAdded` stays what it was while the taint stays."""
    for uuid in list(since):
        if uuid not in current:
            del since[uuid]
    for uuid in current:
        since.setdefault(uuid, _now())


def _since(since: Mapping[str, str], device: DraDevice) -> str:
    return since.get(device.uuid) or since.get(device.gpu.uuid, "")


def _identity(objs: list[Json]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((s.name, s.resource_version) for s in map(StoredSlice.read, objs)))


def _generation(objs: list[Json]) -> int | None:
    for s in map(StoredSlice.read, objs):
        if s.generation is not None:
            return s.generation
    return None
