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
from datetime import datetime

from lightkube import AsyncClient
from lightkube.models.core_v1 import ObjectReference

from gpuslice.k8s.events import EventSeries, utc_now
from gpuslice.logs import get_logger

log = get_logger(__name__)

CLAIM_API_VERSION = "resource.k8s.io/v1"


class ClaimEvents:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        component: str = "gpuslice",
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._series = EventSeries(client, node_name, component=component, clock=clock)

    async def post(self, namespace: str, name: str, uid: str, reason: str, message: str) -> bool:
        """A Warning Event about the claim, in its namespace; a repeat bumps its count."""
        claim = ObjectReference(
            kind="ResourceClaim",
            apiVersion=CLAIM_API_VERSION,
            name=name,
            namespace=namespace,
            uid=uid,
        )
        try:
            await self._series.post(
                uid, about=claim, namespace=namespace, reason=reason, message=message
            )
        except Exception as exc:
            log.warning("k8s-claim-event-failed", reason=reason, claim=uid, error=str(exc))
            return False
        return True
