"""Warning Events about a ResourceClaim, in the claim's namespace, for the claim's author.

What Prepare has to tell a tenant (`ClaimConfigNotApplied`: the claim was prepared on the
node's terms, not its own config) is read where the tenant looks: `kubectl describe
resourceclaim` and `kubectl events --for resourceclaim/<name>` in the claim's namespace,
as the kubelet and the scheduler post what concerns a pod about the pod. The API server
takes an Event only in the namespace of the object it is about, so this needs `create`
(and `patch`, for a repeat's count) on Events in every namespace where claims are: the
chart grants it with DRA mode (docs/install.md, "Privileges"). Like `NodeEvents`, posting
is best effort: a failure is logged and reported as False, never raised into Prepare.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from lightkube import AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from gpuslice.k8s.events import MESSAGE_LIMIT
from gpuslice.logs import get_logger

log = get_logger(__name__)

CLAIM_API_VERSION = "resource.k8s.io/v1"
REMEMBERED = 256
"""Claims whose last Event is remembered, for a repeat to bump its count."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ClaimEvents:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        component: str = "gpuslice",
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._client = client
        self._node = node_name
        self._component = component
        self._clock = clock
        self._last: dict[str, tuple[tuple[str, str], str, int]] = {}
        """Claim UID -> ((reason, message), event name, count): a repeat bumps the count.
        The latest `REMEMBERED` claims only, so it does not grow with the agent's life."""

    async def post(self, namespace: str, name: str, uid: str, reason: str, message: str) -> bool:
        """A Warning Event about the claim, in its namespace."""
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 3] + "..."
        now = self._clock().replace(microsecond=0)
        last = self._last.get(uid)
        try:
            if last is not None and last[0] == (reason, message):
                count = last[2] + 1
                await self._client.patch(
                    Event,
                    last[1],
                    {"count": count, "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ")},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
                self._last[uid] = (last[0], last[1], count)
                return True
            claim = ObjectReference(
                kind="ResourceClaim",
                apiVersion=CLAIM_API_VERSION,
                name=name,
                namespace=namespace,
                uid=uid,
            )
            event = Event(
                metadata=ObjectMeta(generateName=f"{name}.", namespace=namespace),
                involvedObject=claim,
                reason=reason,
                message=message,
                type="Warning",
                source=EventSource(component=self._component, host=self._node),
                reportingComponent=self._component,
                reportingInstance=self._node,
                firstTimestamp=now,
                lastTimestamp=now,
                count=1,
            )
            created = await self._client.create(event)
        except Exception as exc:
            log.warning("k8s-claim-event-failed", reason=reason, claim=uid, error=str(exc))
            return False
        event_name = created.metadata.name if created.metadata is not None else None
        if event_name is not None:
            self._last.pop(uid, None)
            self._last[uid] = ((reason, message), event_name, 1)
            while len(self._last) > REMEMBERED:
                del self._last[next(iter(self._last))]
        return True
