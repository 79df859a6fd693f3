"""Kubernetes Events from the agent: why a config was rejected or what was applied.

A rejected config (the old plan stays in force) must be visible outside the pod's log.
Posting is best effort: a failure is logged and reported as False, never raised into the
agent's reload path. Repeats of the same event bump its count instead of creating new
objects, as the kubelet's recorder does.

Where Events go, least privilege first: the agent may create Events in its own namespace
only (a Role, not a ClusterRole). The API server accepts an Event only in the namespace of
the object it is about (`default` for a cluster-scoped one such as a Node; checked against
kube-apiserver 1.36.2: "involvedObject.namespace: does not match event.namespace"), so in a
pod (`AgentPod`, from the downward API) each Event is about the agent's own Pod, names the
Node in `related` and in its message, and `kubectl events -n <agent namespace>` lists them.
Run outside a pod (no POD_NAME), it falls back to an Event on the Node in `default`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from gpuslice.logs import get_logger

log = get_logger(__name__)

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class AgentPod:
    """The agent's own Pod: where its Events live and what they are about."""

    namespace: str
    name: str
    uid: str | None = None

    def reference(self) -> ObjectReference:
        return ObjectReference(
            kind="Pod", apiVersion="v1", name=self.name, namespace=self.namespace, uid=self.uid
        )


MESSAGE_LIMIT = 1024
"""The API server rejects longer Event messages; longer ones are cut with an ellipsis."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def _cut(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


class EventSeries:
    """Create an Event, or bump the count of the last one posted under the same key when it
    says the same again, as the kubelet's recorder does: the one mechanism behind the
    node's, the guard's pod and the claims' Events. The latest `remembered` keys only, so
    it does not grow with the agent's life. A failure raises; the caller logs it (posting
    stays best effort) and the key is forgotten, so the next post creates anew."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        component: str = "gpuslice",
        clock: Callable[[], datetime] = utc_now,
        remembered: int = 256,
    ) -> None:
        self._client = client
        self._node = node_name
        self._component = component
        self._clock = clock
        self._remembered = remembered
        self._last: dict[Hashable, tuple[tuple[str, str, str], str, int]] = {}
        """Key -> ((reason, type, message), event name, count)."""

    async def post(
        self,
        key: Hashable,
        *,
        about: ObjectReference,
        namespace: str,
        reason: str,
        message: str,
        type: EventType = "Warning",
        related: ObjectReference | None = None,
    ) -> None:
        message = _cut(message)
        now = self._clock().replace(microsecond=0)
        said = (reason, type, message)
        last = self._last.get(key)
        try:
            if last is not None and last[0] == said:
                count = last[2] + 1
                await self._client.patch(
                    Event,
                    last[1],
                    {"count": count, "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ")},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
                self._last[key] = (said, last[1], count)
                return
            event = Event(
                metadata=ObjectMeta(generateName=f"{about.name}.", namespace=namespace),
                involvedObject=about,
                related=related,
                reason=reason,
                message=message,
                type=type,
                source=EventSource(component=self._component, host=self._node),
                reportingComponent=self._component,
                reportingInstance=self._node,
                firstTimestamp=now,
                lastTimestamp=now,
                count=1,
            )
            created = await self._client.create(event)
        except Exception:
            self._last.pop(key, None)
            raise
        self._last.pop(key, None)
        name = created.metadata.name if created.metadata is not None else None
        if name is not None:
            self._last[key] = (said, name, 1)
            while len(self._last) > self._remembered:
                del self._last[next(iter(self._last))]


class NodeEvents:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        namespace: str = "default",
        *,
        component: str = "gpuslice",
        clock: Callable[[], datetime] = utc_now,
        agent: AgentPod | None = None,
    ) -> None:
        """`namespace` is used only without `agent` (then Events are on the Node)."""
        self._client = client
        self._node = node_name
        self._agent = agent
        self._namespace = agent.namespace if agent is not None else namespace
        self._node_uid: str | None = None
        self._series = EventSeries(client, node_name, component=component, clock=clock)

    async def _uid(self) -> str:
        """The Node's UID, so `kubectl describe node` lists the event; the node name when
        the Node cannot be read (what the kubelet itself uses for node events)."""
        if self._node_uid is None:
            try:
                node = await self._client.get(Node, self._node)
                uid = node.metadata.uid if node.metadata is not None else None
                self._node_uid = uid or self._node
            except ApiError:
                self._node_uid = self._node
        return self._node_uid

    async def post(self, reason: str, message: str, *, type: EventType = "Normal") -> bool:
        """Record one event (e.g. `ConfigRejected`/Warning, `ConfigApplied`/Normal)."""
        try:
            node = ObjectReference(
                kind="Node", apiVersion="v1", name=self._node, uid=await self._uid()
            )
            about, related, said = addressed(self._agent, node, f"Node {self._node}", message)
            await self._series.post(
                "node",
                about=about,
                namespace=self._namespace,
                reason=reason,
                message=said,
                type=type,
                related=related,
            )
        except Exception as exc:
            log.warning("k8s-event-failed", reason=reason, error=str(exc))
            return False
        return True


def addressed(
    agent: AgentPod | None, target: ObjectReference, what: str, message: str
) -> tuple[ObjectReference, ObjectReference | None, str]:
    """(about, related, message) of an Event about `target`: in a pod, about the agent's
    Pod with `target` related and named (`what`) at the start of the message; outside
    one, about `target` itself."""
    if agent is None:
        return target, None, message
    return agent.reference(), target, _cut(f"{what}: {message}")
