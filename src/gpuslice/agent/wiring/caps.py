"""Memory caps as the agent wires them at start: what the node and each GPU allow, what
the front end hands containers, and the caps loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.agent.caps import (
    CapsApplier,
    CapsService,
    HookProgram,
    gpu_capabilities,
    node_capability,
    pod_containers,
)
from gpuslice.agent.runner import Agent
from gpuslice.backends import memory_limiter_of
from gpuslice.core.caps import CapsView, ContainerCaps, GpuCapability, caps_view
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.sharing.model import Plan
from gpuslice.metrics import SnapshotRefresher

if TYPE_CHECKING:
    from gpuslice.k8s import NodePods


@dataclass(frozen=True, slots=True)
class WiredCaps:
    """Memory caps as wired at start: each GPU's capability (found once) and the caps loop,
    None where nothing can be capped."""

    capabilities: Mapping[str, GpuCapability]
    guard_mode: str
    service: CapsService | None

    def view(self) -> CapsView:
        """What the metrics, `/status` and `top` show: each GPU's protection as it holds
        (capped only where the loop confirmed limits), each capped container's limits and
        why the others are not."""
        if self.service is None:
            return caps_view(self.capabilities, self.guard_mode, {}, gpus={})
        applier = self.service.applier
        return caps_view(
            applier.capabilities,
            self.guard_mode,
            applier.readings(),
            applier.windows_s,
            gpus=applier.gpu_states(),
            pending=applier.pending(),
        )


class CapsInputs:
    """What the caps loop reads of the agent each round: the plan the front end serves,
    the processes of each container, this node's pods."""

    def __init__(
        self, agent: Agent, refresher: SnapshotRefresher | None, pods: NodePods | None
    ) -> None:
        self._agent = agent
        self._refresher = refresher
        self._pods = pods

    def plan(self) -> Plan | None:
        current = self._agent.front_end.attributed_plan()
        return None if current is None else current[0]

    def pids(self) -> dict[ContainerKey, tuple[int, ...]]:
        snap = self._refresher.latest if self._refresher is not None else None
        if snap is None:
            return {}
        return {
            ContainerKey(u.namespace, u.pod, u.container): u.pids for u in snap.attribution.usages
        }

    def containers(self) -> list[tuple[ContainerKey, str, str]] | None:
        assert self._pods is not None  # handed to the loop only where there is a pod watch
        return pod_containers(self._pods.pods())


def wire_caps(
    agent: Agent, *, pods: NodePods | None = None, refresher: SnapshotRefresher | None = None
) -> WiredCaps:
    """Memory caps (docs/memory-guard.md): what the node and each GPU allow, found once
    (each refusal logged once), then as the caps loop finds it; the front end hands them
    to containers (DRA's claim specs carry the limits and the toolkit's hook where it can
    work; the device plugin's Allocate gives the hook's variables where the toolkit's spec
    carries the hook); in both modes the caps loop applies, checks and repairs each shared
    container's limits. No loop when caps are off or no GPU is capable: the guard then
    covers every GPU as before."""
    settings = agent.settings
    caps_settings = settings.memory_caps
    limiter = memory_limiter_of(agent.backend)
    node = node_capability(settings.cgroup_root)
    inventory = agent.state.current.inventory
    capabilities = gpu_capabilities(inventory, limiter, node, caps_settings.mode)
    capable = any(c.capable for c in capabilities.values())
    hook = HookProgram(
        caps_settings.hook_path,
        agent.loaded.config.flags.nvidia_driver_root,
        node,
        capable,
        seen_at=caps_settings.hook_seen_at,
    )
    guard_mode = settings.memory_guard.mode
    applier = (
        None
        if limiter is None or not capable
        else CapsApplier(limiter, capabilities, cgroup_root=settings.cgroup_root)
    )
    # What containers are handed from now on follows the loop: a GPU it refuses or backs
    # off from gets neither the hook's variables (Allocate) nor its limits (a claim's spec).
    handed = capabilities.copy if applier is None else applier.hook_capabilities
    agent.front_end.take_caps(ContainerCaps(handed, caps_settings.policy, hook.cdi))
    if applier is None:
        return WiredCaps(capabilities, guard_mode, None)
    inputs = CapsInputs(agent, refresher, pods)
    service = CapsService(
        applier,
        policy=caps_settings.policy,
        current_plan=inputs.plan,
        assignments=agent.front_end.assignments(settings.pod_resources_socket),
        pods=inputs.containers if pods is not None else None,
        pids=inputs.pids,
        cgroup_root=settings.cgroup_root,
        proc_root=settings.proc_root,
        interval_s=settings.memory_guard.interval_s,
    )
    agent.hooks.services.append(service.run)
    return WiredCaps(capabilities, guard_mode, service)
