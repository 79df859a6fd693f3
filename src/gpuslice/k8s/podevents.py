"""Warning Events about a pod and the Eviction API, for the memory guard.

The guard's `GPUMemoryOverShare` / `GPUMemoryReclaimed` Events name the pod, the GPU, the
usage, the share and the free memory. The agent creates Events in its own namespace only
(`k8s.events` says why): in a pod (`AgentPod`) each is about the agent's Pod with the
stopped pod in `related` and at the start of its message; outside one it falls back to an
Event on the pod itself, in the pod's namespace. Like `NodeEvents`, posting is best effort:
a failure is logged and reported as False, never raised into the guard's loop; a repeat of
the same event about the same pod bumps its count.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpuslice.k8s.events import AgentPod, EventSeries, addressed, utc_now
from gpuslice.logs import get_logger

log = get_logger(__name__)


class PodEvents:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        component: str = "gpuslice",
        clock: Callable[[], datetime] = utc_now,
        agent: AgentPod | None = None,
    ) -> None:
        self._agent = agent
        self._series = EventSeries(client, node_name, component=component, clock=clock)

    async def post(
        self, namespace: str, pod: str, uid: str | None, reason: str, message: str
    ) -> bool:
        """A Warning Event about the pod (`uid` lets `kubectl describe pod` match it); a
        repeat about the same pod bumps its count."""
        target = ObjectReference(
            kind="Pod", apiVersion="v1", name=pod, namespace=namespace, uid=uid
        )
        about, related, message = addressed(self._agent, target, f"Pod {namespace}/{pod}", message)
        try:
            await self._series.post(
                (namespace, pod),
                about=about,
                namespace=about.namespace or namespace,
                reason=reason,
                message=message,
                related=related,
            )
        except Exception as exc:
            log.warning("k8s-event-failed", reason=reason, pod=pod, error=str(exc))
            return False
        return True


class PodEvictor:
    """The Eviction API: the pod is deleted with its grace period, and a
    PodDisruptionBudget that allows no disruption refuses it (429)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def evict(self, namespace: str, pod: str) -> bool:
        body = Pod.Eviction(metadata=ObjectMeta(name=pod, namespace=namespace))
        try:
            await self._client.create(body, name=pod, namespace=namespace)
        except ApiError as exc:
            log.warning(
                "guard-eviction-refused",
                namespace=namespace,
                pod=pod,
                status=exc.status.code,
                error=exc.status.message,
            )
            return False
        except Exception as exc:
            log.warning("guard-eviction-failed", namespace=namespace, pod=pod, error=str(exc))
            return False
        return True
