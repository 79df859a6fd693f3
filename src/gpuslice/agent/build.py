"""Building an agent from settings: opens the backend, builds the front end the settings
select (`agent.front_ends`) and wires the optional adapters (`agent.wiring`).

Kept apart from `runner` so tests and the demo can hand the agent their own doubles
(a simulated backend, an emulated kubelet, a fake MPS control program) while
`gpuslice plugin` gets the real ones. Each `wire_*` function adds one adapter's hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuslice.agent.front import FrontEndParts
from gpuslice.agent.front_ends import front_end_of
from gpuslice.agent.inventory_watch import inventory_watcher
from gpuslice.agent.runner import Agent, FirstPlan, first_plan, plan_state
from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.wiring.caps import wire_caps
from gpuslice.agent.wiring.events import NodeEventHooks, agent_pod, wire_events
from gpuslice.agent.wiring.guard import wire_guard
from gpuslice.agent.wiring.labels import wire_label_api, wire_label_file
from gpuslice.agent.wiring.metrics import (
    PROBE_LIMITS,
    snapshot_refresher,
    wire_metrics,
    wire_probes,
)
from gpuslice.backends import open_backend
from gpuslice.core.cordon import CORDON_ANNOTATION
from gpuslice.core.errors import GpusliceError
from gpuslice.metrics.server import ServerLimits
from gpuslice.ports import GpuBackend

if TYPE_CHECKING:
    # The Kubernetes client (lightkube, httpx: about 11 MiB resident) is imported only
    # where the agent talks to an API server: a device plugin without one never loads it.
    from lightkube import AsyncClient


@asynccontextmanager
async def build_agent(settings: AgentSettings) -> AsyncIterator[Agent]:
    """Open the node, put the first plan in force, then wire its front end and adapters
    to the plan state: nothing is wired to a plan that does not exist yet."""
    for problem in settings.problems():  # the CLI refused these already; code callers too
        raise GpusliceError(problem)
    backend = await asyncio.to_thread(
        open_backend, settings.node, control_dir=settings.sim_control_dir
    )
    watcher_task: asyncio.Task[None] | None = None
    client: AsyncClient | None = None
    try:
        labels: asyncio.Queue[str] | None = None
        cordons: asyncio.Queue[str] | None = None
        if settings.node_name:
            from gpuslice.k8s import NodeLabelWatcher, make_client

            client = make_client(settings.kubeconfig)
            labels = asyncio.Queue()
            cordons = asyncio.Queue()
            watcher = NodeLabelWatcher(
                client,
                settings.node_name,
                settings.node_label,
                annotation_key=CORDON_ANNOTATION,
                on_annotation=cordons.put_nowait,
            )
            watcher_task = asyncio.create_task(watcher.feed(labels), name="node-label-watch")
        first = await first_plan(settings, backend, label_values=labels, cordon_values=cordons)
        yield await _wire(settings, backend, first, client, labels, cordons)
    finally:
        if watcher_task is not None:
            watcher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher_task
        if client is not None:
            await client.close()
        await asyncio.to_thread(backend.close)


async def _wire(
    settings: AgentSettings,
    backend: GpuBackend,
    first: FirstPlan,
    client: AsyncClient | None,
    labels: asyncio.Queue[str] | None,
    cordons: asyncio.Queue[str] | None,
) -> Agent:
    """The agent with its front end and every adapter the settings ask for."""
    state = plan_state(first)
    events: NodeEventHooks | None = None
    if client is not None:
        from gpuslice.k8s import NodeEvents

        events = NodeEventHooks(
            NodeEvents(client, settings.node_name, "default", agent=agent_pod(settings))
        )
    warn = None if events is None else events.warn
    front = front_end_of(settings).build(
        FrontEndParts(state, settings, backend, client, warn, first.loaded.config.config.flags)
    )
    agent = Agent(
        settings, backend, state, first, front, label_values=labels, cordon_values=cordons
    )
    if events is not None:
        wire_events(agent, events)
    mps = front.wire_mps(agent)
    node_pods = None
    if client is not None:
        from gpuslice.k8s import NodePods

        node_pods = NodePods(client, settings.node_name)
    refresher = snapshot_refresher(settings, backend, front, node_pods)
    caps = wire_caps(agent, pods=node_pods, refresher=refresher)
    guard = wire_guard(
        settings,
        backend,
        front,
        agent.hooks,
        client=client,
        refresher=refresher,
        caps=caps.service,
        mps=mps,
    )
    exporting = settings.metrics_port is not None and settings.gpu_metrics
    if node_pods is not None and (exporting or guard is not None or caps.service is not None):
        agent.hooks.services.append(node_pods.run)  # one watch, for all who read it
    if settings.metrics_port is not None:
        wire_metrics(
            agent,
            port=settings.metrics_port,
            host=settings.metrics_address,
            guard=guard,
            caps=caps,
            mps=mps,
            gpu_metrics=settings.gpu_metrics,
            refresher=refresher,
            limits=ServerLimits(
                head_timeout_s=settings.http_head_timeout_s,
                max_per_address=settings.http_max_per_address,
            ),
        )
    if settings.health_port is not None:
        wire_probes(
            agent,
            port=settings.health_port,
            host=settings.metrics_address,
            limits=replace(
                PROBE_LIMITS,
                head_timeout_s=settings.http_head_timeout_s,
                max_per_address=min(PROBE_LIMITS.max_per_address, settings.http_max_per_address),
            ),
        )
    if settings.labels_mode == "file":
        wire_label_file(agent, settings.labels_file)
    elif settings.labels_mode == "api" and client is not None:
        from gpuslice.k8s import NodeLabeler

        wire_label_api(agent, NodeLabeler(client, settings.node_name))
    agent.hooks.services.append(inventory_watcher(agent, warn))
    return agent
