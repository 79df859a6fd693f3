"""The `resource.k8s.io/v1` objects of one node, in memory, for `gpuslice demo`.

The demo runs the real DRA driver without a Kubernetes API server (the HTTP double lives in
`gpuslice.testing`, which is not shipped). `DraStore` implements `ports.DraObjects` for one
node and driver with the API's rules that the driver depends on: `generateName`, a
resourceVersion per write, 409 (`DraConflict`) for a replace from a stale read, 404
(`DraObjectNotFound`) for a missing object, claim UIDs that change when a claim is
recreated. Around it, what the rest of a cluster would do: users add DeviceClasses and
claims, `allocate_claim` plays the scheduler (`whatif.allocator.allocate`), `wipe_slices` the
kubelet at its restart. This node's slices can be watched as the API's are: the events after
a resourceVersion, from a bounded history (older: `DraExpired`, as 410 Gone).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from datetime import UTC, datetime
from typing import Any

from gpuslice.core.jsontypes import Json
from gpuslice.ports import DraConflict, DraExpired, DraObjectNotFound, SliceEvent, SliceListing
from gpuslice.whatif.allocator import allocate

HISTORY = 1000
"""Slice events kept for watches resuming from an older version."""


class DraStore:
    """DeviceClasses, ResourceClaims and ResourceSlices; the `ports.DraObjects` methods see
    only this node's slices of this driver."""

    def __init__(
        self,
        node: str,
        driver: str,
        *,
        node_uid: str | None = None,
        share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.node = node
        self.driver = driver
        self._node_uid = node_uid if node_uid is not None else str(uuid.uuid4())
        self._share_id = share_id
        self._lock = threading.Lock()
        """Demo helpers may run in other threads than the driver's event loop."""
        self._rv = itertools.count(1)
        self._classes: dict[str, Json] = {}
        self._claims: dict[tuple[str, str], Json] = {}
        self._slices: dict[str, Json] = {}
        self._history: list[tuple[int, SliceEvent]] = []
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # -- ports.DraObjects ----------------------------------------------------------------

    async def get_claim(self, namespace: str, name: str) -> Json:
        return self.claim(namespace, name)

    async def list_claims(self, uids: Collection[str] | None = None) -> list[Json]:
        return [c for c in self.claims() if uids is None or c["metadata"]["uid"] in uids]

    async def node_uid(self) -> str:
        return self._node_uid

    async def list_slices(self) -> list[Json]:
        return self.slices(node=self.node, driver=self.driver)

    async def listed_slices(self) -> SliceListing:
        with self._lock:
            version = self._version()
        return SliceListing(self.slices(node=self.node, driver=self.driver), version)

    async def watch_slices(self, resource_version: str) -> AsyncIterator[SliceEvent]:
        woken = asyncio.Event()
        entry = (asyncio.get_running_loop(), woken)
        position = int(resource_version or 0)
        with self._lock:
            oldest = self._history[0][0] if self._history else None
            if oldest is not None and position < oldest - 1:
                raise DraExpired(f"too old resource version: {position}")
            self._watchers.append(entry)
        try:
            while True:
                with self._lock:
                    pending = [(rv, e) for rv, e in self._history if rv > position]
                for rv, event in pending:
                    position = rv
                    yield event
                await woken.wait()
                woken.clear()
        finally:
            with self._lock:
                self._watchers.remove(entry)

    def _version(self) -> str:
        """The store's current resourceVersion (call with the lock held)."""
        return str(self._history[-1][0]) if self._history else "0"

    def _slice_event(self, kind: str, obj: Json) -> None:
        """Record a change of one of this node's slices and wake the watches (call with
        the lock held; a deletion takes a version of its own, as in the API)."""
        spec = obj.get("spec") or {}
        if spec.get("nodeName") != self.node or spec.get("driver") != self.driver:
            return
        event = copy.deepcopy(obj)
        if kind == "DELETED":
            event["metadata"]["resourceVersion"] = str(next(self._rv))
        rv = int(event["metadata"]["resourceVersion"])
        self._history.append((rv, SliceEvent(kind, event)))
        del self._history[:-HISTORY]
        for loop, woken in self._watchers:
            loop.call_soon_threadsafe(woken.set)

    async def create_slice(self, obj: Json) -> Json:
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        with self._lock:
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ValueError("a slice needs metadata.name or metadata.generateName")
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            if meta["name"] in self._slices:
                raise DraConflict(f"ResourceSlice {meta['name']} already exists")
            for server_set in ("uid", "resourceVersion", "creationTimestamp"):
                meta.pop(server_set, None)
            stored = self._stored(self._slices, meta["name"], new, None, "ResourceSlice")
            self._slice_event("ADDED", stored)
            return stored

    async def replace_slice(self, obj: Json) -> Json:
        new = copy.deepcopy(obj)
        name = str(new["metadata"]["name"])
        with self._lock:
            current = self._slices.get(name)
            if current is None:
                raise DraObjectNotFound(f"ResourceSlice {name} not found")
            sent = str(new["metadata"].get("resourceVersion") or "")
            if sent and sent != current["metadata"]["resourceVersion"]:
                raise DraConflict(f"ResourceSlice {name}: the object has been modified")
            stored = self._stored(self._slices, name, new, current, "ResourceSlice")
            self._slice_event("MODIFIED", stored)
            return stored

    async def delete_slice(self, name: str) -> None:
        with self._lock:
            gone = self._slices.pop(name, None)
            if gone is None:
                raise DraObjectNotFound(f"ResourceSlice {name} not found")
            self._slice_event("DELETED", gone)

    # -- the rest of the cluster ---------------------------------------------------------

    def add_device_class(self, obj: Json) -> Json:
        with self._lock:
            name = str(obj["metadata"]["name"])
            old = self._classes.get(name)
            return self._stored(self._classes, name, copy.deepcopy(obj), old, "DeviceClass")

    def device_classes(self) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(c) for _, c in sorted(self._classes.items())]

    def add_claim(self, obj: Json) -> Json:
        """A user's ResourceClaim (`metadata.namespace` and `name` required): a new UID,
        no status."""
        new = copy.deepcopy(obj)
        meta = new["metadata"]
        key = (str(meta["namespace"]), str(meta["name"]))
        with self._lock:
            if key in self._claims:
                raise DraConflict(f"ResourceClaim {key[0]}/{key[1]} already exists")
            for server_set in ("uid", "resourceVersion", "creationTimestamp"):
                meta.pop(server_set, None)
            new.pop("status", None)
            return self._stored(self._claims, key, new, None, "ResourceClaim")

    def claim(self, namespace: str, name: str) -> Json:
        with self._lock:
            found = self._claims.get((namespace, name))
            if found is None:
                raise DraObjectNotFound(f"ResourceClaim {namespace}/{name} not found")
            return copy.deepcopy(found)

    def claims(self) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(c) for _, c in sorted(self._claims.items())]

    def set_claim_status(self, namespace: str, name: str, status: Json | None) -> Json:
        """Write (None: clear) the status, as the scheduler or the claim controller does."""
        with self._lock:
            current = self._claims.get((namespace, name))
            if current is None:
                raise DraObjectNotFound(f"ResourceClaim {namespace}/{name} not found")
            new = copy.deepcopy(current)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = copy.deepcopy(status)
            return self._stored(self._claims, (namespace, name), new, current, "ResourceClaim")

    def delete_claim(self, namespace: str, name: str) -> None:
        with self._lock:
            if self._claims.pop((namespace, name), None) is None:
                raise DraObjectNotFound(f"ResourceClaim {namespace}/{name} not found")

    def slices(self, node: str | None = None, driver: str | None = None) -> list[Json]:
        """Slices in name order (as the API lists them), optionally one node's, one driver's."""
        with self._lock:
            return [
                copy.deepcopy(s)
                for _, s in sorted(self._slices.items())
                if (node is None or s["spec"].get("nodeName") == node)
                and (driver is None or s["spec"].get("driver") == driver)
            ]

    def wipe_slices(self, driver: str | None = None) -> int:
        """The kubelet's wipe: every slice of this node at its start, one driver's 30 s
        after that driver's plugin went away. Returns how many went."""
        with self._lock:
            doomed = [
                name
                for name, s in self._slices.items()
                if s["spec"].get("nodeName") == self.node
                and (driver is None or s["spec"].get("driver") == driver)
            ]
            for name in doomed:
                self._slice_event("DELETED", self._slices.pop(name))
            return len(doomed)

    def allocate_claim(
        self,
        namespace: str,
        name: str,
        pod_uid: str | None = None,
        *,
        pod_name: str | None = None,
    ) -> Json:
        """Play the scheduler: allocate the claim on this node (kept when it is allocated
        already, as a claim shared by pods is) and reserve it for the pod, if one is given.
        Returns the claim; `whatif.allocator.AllocationError` when nothing fits."""
        with self._lock:
            current = self._claims.get((namespace, name))
            if current is None:
                raise DraObjectNotFound(f"ResourceClaim {namespace}/{name} not found")
            status = copy.deepcopy(current.get("status") or {})
            if not status.get("allocation"):
                others = [
                    c["status"]["allocation"]
                    for key, c in self._claims.items()
                    if key != (namespace, name) and (c.get("status") or {}).get("allocation")
                ]
                status["allocation"] = allocate(
                    current,
                    list(self._classes.values()),
                    sorted(self._slices.values(), key=lambda s: str(s["metadata"]["name"])),
                    others,
                    node=self.node,
                    share_id=self._share_id,
                )
            if pod_uid is not None:
                reserved = status.setdefault("reservedFor", [])
                if all(r.get("uid") != pod_uid for r in reserved):
                    reserved.append(
                        {"resource": "pods", "name": pod_name or pod_uid, "uid": pod_uid}
                    )
            new = dict(copy.deepcopy(current), status=status)
            return self._stored(self._claims, (namespace, name), new, current, "ResourceClaim")

    # -- internals (call with the lock held) ---------------------------------------------

    def _stored(
        self, table: dict[Any, Json], key: Any, obj: Json, old: Json | None, kind: str
    ) -> Json:
        """Store `obj` with a new resourceVersion; a replaced object keeps its UID."""
        obj.setdefault("apiVersion", "resource.k8s.io/v1")
        obj.setdefault("kind", kind)
        meta = obj.setdefault("metadata", {})
        if old is not None:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        else:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["resourceVersion"] = str(next(self._rv))
        table[key] = obj
        return copy.deepcopy(obj)
