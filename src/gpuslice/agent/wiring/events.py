"""The Node's Events and the agent's own Pod: what the agent tells the cluster about
its configs, the operator's GPU cordon and what it could not do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.agent.runner import Agent
from gpuslice.agent.settings import AgentSettings
from gpuslice.core.cordon import CORDON_ANNOTATION, Cordon
from gpuslice.guard import own_pod_uid

if TYPE_CHECKING:
    from gpuslice.k8s import AgentPod, NodeEvents


@dataclass(frozen=True, slots=True)
class NodeEventHooks:
    """The agent's hooks that post on the Node, where `kubectl describe node` shows them."""

    events: NodeEvents

    async def on_config(self, name: str, accepted: bool, message: str) -> None:
        """A rejected config is a Warning next to the label that asked for it."""
        if accepted:
            await self.events.post("ConfigApplied", message, type="Normal")
        else:
            await self.events.post(
                "ConfigRejected",
                f"config {name!r} refused, previous plan kept: {message}",
                type="Warning",
            )

    async def on_cordon(self, before: Cordon, after: Cordon) -> None:
        """The operator's GPU cordon, answered on the Node where it was set: which GPUs
        are cordoned now (Normal), and any entry that named nothing here (Warning)."""
        if after.devices != before.devices:
            if after.names:
                message = f"cordoned by {CORDON_ANNOTATION}: {', '.join(after.names)}"
                await self.events.post("GpuCordoned", message, type="Normal")
            else:
                await self.events.post("GpuCordonLifted", "no GPU is cordoned now", type="Normal")
        if after.problems and after.problems != before.problems:
            await self.events.post(
                "GpuCordonEntrySkipped", "; ".join(after.problems), type="Warning"
            )

    async def warn(self, reason: str, message: str) -> None:
        """A Warning Event on the Node (what the DRA driver and the inventory watch post)."""
        await self.events.post(reason, message, type="Warning")


def wire_events(agent: Agent, events: NodeEventHooks) -> None:
    """Every reload attempt and every change of the operator's cordon, posted."""
    agent.hooks.on_config.append(events.on_config)
    agent.hooks.on_cordon.append(events.on_cordon)


def agent_pod(settings: AgentSettings) -> AgentPod | None:
    """The agent's own Pod, which its Events are about; None outside a pod."""
    from gpuslice.k8s import AgentPod

    if not settings.pod_name:
        return None
    uid = own_pod_uid(given=settings.pod_uid)
    return AgentPod(settings.namespace, settings.pod_name, str(uid) if uid else None)
