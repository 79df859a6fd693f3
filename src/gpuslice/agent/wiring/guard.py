"""The memory guard (docs/memory-guard.md) wired to the agent: what it reads, whom it
tells, how it acts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gpuslice.agent.caps import CapsService
from gpuslice.agent.front import FrontEnd
from gpuslice.agent.guard_view import guard_view_reader, idle_probe
from gpuslice.agent.runner import AgentHooks
from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.wiring.events import agent_pod
from gpuslice.guard import MemoryGuard, ProcessSignaller, own_pod_uid
from gpuslice.metrics import SnapshotRefresher
from gpuslice.mps import MpsDaemonManager
from gpuslice.ports import GpuBackend

if TYPE_CHECKING:
    from lightkube import AsyncClient


def wire_guard(
    settings: AgentSettings,
    backend: GpuBackend,
    front: FrontEnd,
    hooks: AgentHooks,
    *,
    refresher: SnapshotRefresher,
    client: AsyncClient | None = None,
    caps: CapsService | None = None,
    mps: MpsDaemonManager | None = None,
) -> MemoryGuard | None:
    """The memory guard (docs/memory-guard.md): refreshes the attribution snapshot it shares
    with the exporter at its own interval (NVML and /proc only while the plan shares a GPU
    by time-slicing or MPS; the exporter then reads that snapshot), evaluates the
    pure policy and acts. The refresher's pod watch names the pods on a shared GPU (without
    it several pods on one GPU cannot be told apart and nobody is reclaimed); `client` posts
    Events and evictions; `mps` terminates an MPS tenant's clients through their server
    before they are signalled."""
    guard_settings = settings.memory_guard
    if guard_settings.params.mode == "off":
        return None

    mode_of = front.guard_modes(guard_settings.params.mode, guard_settings.claim_override)
    read = guard_view_reader(
        backend,
        front.attributed_plan,
        refresher,
        settings.proc_root,
        mode_of=mode_of,
        confirmed=None if caps is None else caps.applier.readings,
    )

    guard = MemoryGuard(
        read=read,
        idle_wait=idle_probe(backend),
        params=guard_settings.params,
        interval_s=guard_settings.interval_s,
        action=guard_settings.action,
        signaller=ProcessSignaller(settings.proc_root, own_pod=own_pod_uid(given=settings.pod_uid)),
        evict=_evictor(client),
        post_event=_pod_events(client, settings),
        terminate_mps_clients=None if mps is None else mps.terminate_clients,
    )
    hooks.services.append(guard.run)
    return guard


def _evictor(client: AsyncClient | None) -> Callable[[str, str], Awaitable[bool]] | None:
    if client is None:
        return None
    from gpuslice.k8s import PodEvictor

    return PodEvictor(client).evict


def _pod_events(client: AsyncClient | None, settings: AgentSettings) -> Any:
    if client is None:
        return None
    from gpuslice.k8s import PodEvents

    return PodEvents(client, settings.node_name, agent=agent_pod(settings)).post
