"""The pods on this node, for naming the pods and containers that GPU processes belong to.

A process's cgroup gives its pod UID and container ID (`gpuslice.core.cgroups`), and the
kubelet's PodResources API gives namespace/pod/container per device but no UID. With one
pod per device that is enough; under time-slicing several pods share a device and only the
pod UID tells their processes apart, so the metrics need UID -> (namespace, name) and
container ID -> container name, which only the API server has.

Like an informer: list the node's pods (`fieldSelector=spec.nodeName=<node>`, all
namespaces), then watch from the list's resourceVersion. Unlike one, errors never end it:
a cut stream, an API error or `410 Gone` (history compacted while the watch was resuming)
re-lists, so a pod added or deleted while disconnected is not missed. Failures back off.
The accessors are plain functions over the last complete view, safe to call at any time;
they answer None until the first list succeeded, so "no API access" is not read as "no
pods". The list is served by the watch cache and the watch asks for bookmarks
(`k8s.streams`): at rest nothing is listed, and the server's periodic end of a watch is
resumed from a recent version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from gpuslice.aio.races import first_of
from gpuslice.core.cgroups import ContainerId, PodUid
from gpuslice.k8s.streams import BOOKMARK, list_from_cache, watch_from
from gpuslice.k8s.watching import Backoff
from gpuslice.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PodEntry:
    """What the cache keeps of one pod."""

    uid: PodUid
    namespace: str
    name: str
    containers: tuple[tuple[ContainerId, str], ...]
    """(container ID, container name) for each container that has started, init and
    ephemeral containers included (a GPU check in an init container is a GPU process too)."""


def container_id(status_value: str | None) -> ContainerId | None:
    """The ID in a status `containerID` (`containerd://<id>`, `cri-o://<id>`,
    `docker://<id>`): the part after the scheme, which is what the cgroup path carries.
    None when the container has not started (no value) or the value has no scheme."""
    if not status_value:
        return None
    scheme, sep, ident = status_value.partition("://")
    if not sep or not scheme or not ident:
        return None
    return ContainerId(ident)


def pod_entry(pod: Any) -> PodEntry | None:
    """The cache entry for a lightkube Pod, or None if it lacks a UID, name or namespace."""
    meta = pod.metadata
    if meta is None or not meta.uid or not meta.name or not meta.namespace:
        return None
    containers: list[tuple[ContainerId, str]] = []
    status = pod.status
    if status is not None:
        for statuses in (
            status.initContainerStatuses,
            status.containerStatuses,
            status.ephemeralContainerStatuses,
        ):
            for cs in statuses or ():
                ident = container_id(cs.containerID)
                if ident is not None:
                    containers.append((ident, str(cs.name)))
    return PodEntry(PodUid(meta.uid), str(meta.namespace), str(meta.name), tuple(containers))


@dataclass(frozen=True, slots=True)
class _View:
    """Published together and never mutated, so a reader never sees half an update."""

    entries: tuple[PodEntry, ...]
    uids: dict[PodUid, tuple[str, str]]
    containers: dict[ContainerId, str]


class _Expired(Exception):
    """The watch's resourceVersion was compacted away (410): re-list at once."""


class NodePods:
    """This node's pods, kept current by list + watch; read with `uid_map()` and
    `container_names()`, run with `run(stop)`."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        backoff: Backoff | None = None,
        server_timeout_s: int = 300,
    ) -> None:
        if not node_name:
            raise ValueError("node_name must not be empty (set NODE_NAME)")
        self._client = client
        self._node = node_name
        self._backoff = backoff or Backoff()
        self._server_timeout_s = server_timeout_s
        self._pods: dict[PodUid, PodEntry] = {}
        self._view: _View | None = None
        self.lists = 0
        """Successful lists so far: 1 + re-lists after a failure or a 410 (for tests)."""
        self.reconnects = 0
        """Failed list/watch attempts so far, 410s included (for logs and tests)."""
        self.changed = asyncio.Event()
        """Set after every change to the cache (tests wait on it, then clear it)."""

    # -- readers (sync, for the metrics refresher) -------------------------------------------

    def uid_map(self) -> dict[PodUid, tuple[str, str]] | None:
        """Pod UID -> (namespace, name) for the pods on this node; None before the first list."""
        view = self._view
        return None if view is None else dict(view.uids)

    def container_names(self) -> dict[ContainerId, str] | None:
        """Container ID (no scheme) -> container name; None before the first list."""
        view = self._view
        return None if view is None else dict(view.containers)

    def pods(self) -> tuple[PodEntry, ...] | None:
        """Every cached pod; None before the first list."""
        view = self._view
        return None if view is None else view.entries

    # -- running -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the cache current until `stop` is set. Never raises for API trouble."""
        stopped = asyncio.create_task(stop.wait(), name="node-pods-stop")
        syncing = asyncio.create_task(self._sync_forever(), name=f"node-pods-{self._node}")
        await first_of(stopped, syncing)
        if syncing.done() and not syncing.cancelled():
            failure = syncing.exception()
            if failure is not None:
                raise failure  # a bug, not API trouble (that is retried): let the agent see it

    async def _sync_forever(self) -> None:
        delays = self._backoff.delays()
        expired_last_time = False
        while True:
            try:
                async for _ in self._list_then_watch():
                    # Only a watch event proves the loop healthy: a list that works while
                    # every watch fails (RBAC without "watch") must still back off.
                    delays = self._backoff.delays()
                    expired_last_time = False
            except _Expired:
                self.reconnects += 1
                log.info("pod-watch-expired", node=self._node)
                if not expired_last_time:
                    # The usual cause is a long disconnect; a fresh list fixes it at once.
                    expired_last_time = True
                    continue
            except ApiError as exc:
                self.reconnects += 1
                expired_last_time = False
                log.warning(
                    "pod-watch-failed",
                    node=self._node,
                    status=exc.status.code,
                    error=exc.status.message,
                )
            except Exception as exc:
                self.reconnects += 1
                expired_last_time = False
                log.warning("pod-watch-failed", node=self._node, error=str(exc))
            await asyncio.sleep(next(delays))

    async def _list_then_watch(self) -> AsyncGenerator[None, None]:
        """List the node's pods, replace the cache, then apply watch events from the list's
        resourceVersion. Yields after each watch event (progress)."""
        selector = f"spec.nodeName={self._node}"
        pods, version = await list_from_cache(self._client, Pod, namespace=ALL_NS, fields=selector)
        fresh: dict[PodUid, PodEntry] = {}
        for pod in pods:
            entry = pod_entry(pod)
            if entry is not None:
                fresh[entry.uid] = entry
        self._pods = fresh
        self.lists += 1
        self._publish()
        log.info("pods-listed", node=self._node, pods=len(fresh))
        events = watch_from(
            self._client,
            Pod,
            version,
            namespace=ALL_NS,
            fields=selector,
            server_timeout_s=self._server_timeout_s,
        )
        try:
            async for kind, pod in events:
                if kind != BOOKMARK:
                    self._apply(kind, pod)
                yield
        except ApiError as exc:
            if exc.status.code == 410:
                raise _Expired() from exc
            raise
        finally:
            await _close(events)

    def _apply(self, kind: str, pod: Any) -> None:
        entry = pod_entry(pod)
        if entry is None:
            return
        if kind == "DELETED":
            if self._pods.pop(entry.uid, None) is None:
                return
        elif kind in ("ADDED", "MODIFIED"):
            if self._pods.get(entry.uid) == entry:
                return
            self._pods[entry.uid] = entry
        else:
            return
        self._publish()

    def _publish(self) -> None:
        self._view = _View(
            entries=tuple(self._pods.values()),
            uids={e.uid: (e.namespace, e.name) for e in self._pods.values()},
            containers={cid: name for e in self._pods.values() for cid, name in e.containers},
        )
        self.changed.set()


async def _close(events: object) -> None:
    """lightkube's watch is an async generator: close its HTTP stream now, not at GC."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with suppress(Exception):
            await aclose()
