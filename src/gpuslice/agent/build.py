"""Building an agent from settings: opens the backend and wires the optional adapters.

Kept apart from `runner` so tests and the demo can hand the agent their own doubles
(a simulated backend, an emulated kubelet, a fake MPS control program) while
`gpuslice plugin` gets the real ones. Each `wire_*` function adds one adapter's hooks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpuslice.agent.runner import Agent, AgentHooks
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.core.devices import Inventory
from gpuslice.core.mps import mps_specs
from gpuslice.core.sharing.model import Plan
from gpuslice.metrics import MetricsServer, SnapshotRefresher, exporter_registry
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings, NvidiaSmiComputeMode
from gpuslice.podresources import PodResourcesClient

log = logging.getLogger("gpuslice.agent")


def wire_mps(
    agent: Agent,
    *,
    control: tuple[str, ...],
    set_compute_mode: bool,
    timings: MpsTimings | None = None,
) -> MpsDaemonManager:
    """Run an MPS control daemon per MPS resource; its replicas are Unhealthy while it is down.

    NVIDIA's plugin advertises MPS replicas even when no daemon answers, and pods then fail
    with "remote procedural call between the MPS server and the MPS client failed"; here the
    kubelet sees them Unhealthy (not allocatable) until the daemon answers.
    """

    def withdraw_down_daemons(_resource: str = "", _ready: bool = False) -> None:
        if agent.state is None:
            return
        plan = agent.state.current.plan
        agent.set_withdrawn(
            frozenset(
                dev.physical.uuid
                for res in plan.resources
                if res.strategy == "mps" and not manager.ready(res.name)
                for dev in res.devices
            )
        )

    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(control),
        compute_mode=NvidiaSmiComputeMode() if set_compute_mode else None,
        timings=timings,
        on_readiness=withdraw_down_daemons,
    )

    async def on_plan(plan: Plan, _inventory: Inventory) -> None:
        await manager.reconfigure(mps_specs(plan))
        withdraw_down_daemons()

    agent.hooks.on_plan.append(on_plan)
    agent.hooks.services.append(manager.run)
    return manager


def wire_metrics(agent: Agent, *, port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Serve Prometheus metrics; scrapes read the latest snapshot and never wait on NVML."""
    settings = agent.settings

    def current() -> tuple[Plan, Inventory] | None:
        if agent.state is None:
            return None
        snap = agent.state.current
        return snap.plan, snap.inventory

    refresher = SnapshotRefresher(
        backend=agent.backend,
        assignments=PodResourcesClient(settings.pod_resources_socket),
        current=current,
        hostname=settings.node_name or socket.gethostname(),
    )
    registry, counters = exporter_registry(lambda: refresher.latest)
    server = MetricsServer(registry, host=host, port=port)

    async def on_config(_name: str, accepted: bool, _message: str) -> None:
        counters.record_config_reload(accepted)

    async def serve(stop: asyncio.Event) -> None:
        async with server:
            log.info("event=metrics-listening url=%s", server.url)
            await stop.wait()

    agent.hooks.on_config.append(on_config)
    agent.hooks.on_health.append(counters.record_health_transition)
    agent.hooks.services.extend([refresher.run, serve])
    agent.manager_options["on_allocate"] = counters.record_allocate
    return server


@asynccontextmanager
async def build_agent(settings: AgentSettings) -> AsyncIterator[Agent]:
    backend = await asyncio.to_thread(open_backend, settings.node)
    try:
        agent = Agent(settings, backend, hooks=AgentHooks())
        wire_mps(agent, control=settings.mps_control, set_compute_mode=settings.set_compute_mode)
        if settings.metrics_port is not None:
            wire_metrics(agent, port=settings.metrics_port)
        yield agent
    finally:
        await asyncio.to_thread(backend.close)
