"""Watching this node's config label (`nvidia.com/device-plugin.config` by default), and
with it one annotation (the operator's GPU cordon, `gpuslice.io/gpu-cordon`).

Same semantics as NVIDIA's config-manager informer (REFERENCE §7): the initial value is
delivered at once (unset reads as ""), later values only when they change, and a deleted
node reads as "". Unlike an informer, errors never end the watch: any failure (API server
down, connection cut, 410 Gone) is logged and retried with capped exponential backoff,
re-reading the node so a change made while disconnected is not missed.

As an informer does, the watch starts from the resourceVersion of a *list* (the store's
current revision), not from the Node's own resourceVersion: a Node unchanged for a while
has a version older than the API server's watch cache holds (always so right after the
API server restarts), and a watch from it is answered 410 Gone at once, every time, until
the Node changes (seen on kube-apiserver 1.36: a GET and a failed watch every backoff step,
which a successful GET reset to its shortest). The list is served by the watch cache and
the watch asks for bookmarks (`k8s.streams`), so an idle Node's watch resumes from a recent
version and a node at rest sends no LIST.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from gpuslice.core.backoff import Backoff as Backoff  # re-exported: shared with the kubelet side
from gpuslice.k8s.streams import BOOKMARK, list_from_cache, watch_from
from gpuslice.logs import get_logger

log = get_logger(__name__)


class NodeLabelWatcher:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        label_key: str,
        *,
        backoff: Backoff | None = None,
        server_timeout_s: int = 300,
        annotation_key: str | None = None,
        on_annotation: Callable[[str], None] | None = None,
    ) -> None:
        """With `annotation_key`, the same watch also tells `on_annotation` that Node
        annotation's value (unset reads as ""): at once, then on each change, always before
        the label value read from the same Node (the agent's GPU cordon rides on the one
        Node watch the config label needs; a second watch would double the API load)."""
        if not node_name:
            raise ValueError("node_name must not be empty (set NODE_NAME)")
        self._client = client
        self._node = node_name
        self._key = label_key
        self._backoff = backoff or Backoff()
        self._server_timeout_s = server_timeout_s
        self._annotation_key = annotation_key
        self._on_annotation = on_annotation
        self._annotation: str | None = None
        self.reconnects = 0
        """Failed watch attempts so far (for logs and tests)."""

    def _value(self, node: Any) -> str:
        labels = node.metadata.labels if node.metadata is not None else None
        self._annotate(node)
        return str((labels or {}).get(self._key, ""))

    def _annotate(self, node: Any) -> None:
        """Tell `on_annotation` the watched annotation's value, when it changed (a deleted
        or missing Node reads as "")."""
        if self._annotation_key is None or self._on_annotation is None:
            return
        meta = None if node is None else node.metadata
        annotations = meta.annotations if meta is not None else None
        value = str((annotations or {}).get(self._annotation_key, ""))
        if value != self._annotation:
            self._annotation = value
            self._on_annotation(value)

    async def values(self) -> AsyncGenerator[str, None]:
        """The label's value now, then each time it changes. Runs until cancelled."""
        last: str | None = None
        delays = self._backoff.delays()
        while True:
            try:
                async with aclosing(self._one_watch()) as stream:
                    async for value, watched in stream:
                        if watched:  # only a working watch proves the trouble is over
                            delays = self._backoff.delays()
                        if value != last:
                            last = value
                            yield value
            except ApiError as exc:
                self.reconnects += 1
                log.warning(
                    "node-watch-failed",
                    node=self._node,
                    status=exc.status.code,
                    error=exc.status.message,
                )
            except Exception as exc:
                self.reconnects += 1
                log.warning("node-watch-failed", node=self._node, error=str(exc))
            await asyncio.sleep(next(delays))

    async def _one_watch(self) -> AsyncGenerator[tuple[str, bool], None]:
        """List the node (by name: none is ""), then stream its changes from the list's
        resourceVersion; each value comes with whether the watch delivered it."""
        selector = f"metadata.name={self._node}"
        nodes, version = await list_from_cache(self._client, Node, fields=selector)
        if not nodes:
            log.warning("node-not-found", node=self._node)
            self._annotate(None)
        yield (self._value(nodes[0]) if nodes else ""), False
        events = watch_from(
            self._client,
            Node,
            version,
            fields=selector,
            server_timeout_s=self._server_timeout_s,
        )
        try:
            async for kind, obj in events:
                if kind == BOOKMARK:
                    continue  # the version moved on; nothing about the Node did
                if kind == "DELETED":
                    self._annotate(None)
                yield ("" if kind == "DELETED" else self._value(obj)), True
        finally:
            # close the HTTP stream now, not at GC
            await events.aclose()

    async def feed(self, queue: asyncio.Queue[str]) -> None:
        """Push every value into `queue` (what the agent's reload loop reads)."""
        async with aclosing(self.values()) as stream:
            async for value in stream:
                queue.put_nowait(value)
