"""The attribution poll the exporter and the guard share, the metrics listener (metrics,
probes, `/status`) and the probes' own listener."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gpuslice.agent.front import FrontEnd
from gpuslice.agent.knobs import knob_of
from gpuslice.agent.runner import Agent
from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.wiring.caps import WiredCaps
from gpuslice.core.errors import GpusliceError
from gpuslice.guard import MemoryGuard
from gpuslice.logs import get_logger
from gpuslice.metrics import MetricsServer, SnapshotRefresher, exporter_registry
from gpuslice.metrics.caps import CapsCollector
from gpuslice.metrics.plugin import PluginMetrics
from gpuslice.metrics.server import ServerLimits
from gpuslice.metrics.status import build_status
from gpuslice.mps import MpsDaemonManager
from gpuslice.ports import GpuBackend

if TYPE_CHECKING:
    from gpuslice.k8s import NodePods

log = get_logger("gpuslice.agent")


def snapshot_refresher(
    settings: AgentSettings,
    backend: GpuBackend,
    front: FrontEnd,
    pods: NodePods | None = None,
) -> SnapshotRefresher:
    """The one attribution poll (NVML processes and telemetry, PodResources, `/proc`) that
    the exporter and the memory guard share: the guard refreshes it at its own interval,
    and the exporter's loop only refreshes when nobody did within `metrics_interval_s`."""
    return SnapshotRefresher(
        backend=backend,
        assignments=front.assignments(settings.pod_resources_socket),
        current=front.attributed_plan,
        hostname=settings.node_name or socket.gethostname(),
        proc_root=settings.proc_root,
        interval_s=settings.metrics_interval_s,
        pods=pods.uid_map if pods is not None else None,
        container_names=pods.container_names if pods is not None else None,
    )


class PortUnavailable(GpusliceError):
    """A listener's port cannot be bound (taken, or not ours to bind)."""


async def listen(server: MetricsServer, setting: str) -> None:
    """Bind the server's port, or end the agent with one line naming the port and every
    name it may have been set by: a port another process holds (dcgm-exporter's 9400
    under hostNetwork) is a setting to change, not a crash to read a traceback for."""
    try:
        await server.start()
    except OSError as exc:
        raise PortUnavailable(
            f"cannot listen on {server.host or '*'}:{server.requested_port}: "
            f"{os.strerror(exc.errno) if exc.errno else exc}; choose another port with "
            f"{knob_of(AgentSettings, setting).names()}"
        ) from None


class Listener:
    """A server run as one of the agent's services, its port bound or the agent ended."""

    def __init__(self, server: MetricsServer, setting: str, event: str, path: str = "") -> None:
        """`setting`: the port's, named when it cannot be bound; `path`: the page the
        start line points at."""
        self._server = server
        self._setting = setting
        self._event = event
        self._path = path

    async def serve(self, stop: asyncio.Event) -> None:
        await listen(self._server, self._setting)
        async with self._server:
            log.info(self._event, url=self._server.base_url + self._path)
            await stop.wait()


class MetricsPages:
    """What the metrics listener reads of the agent: `/status`, each GPU's index for the
    caps metrics, and the reload counter."""

    def __init__(
        self,
        agent: Agent,
        refresher: SnapshotRefresher,
        counters: PluginMetrics,
        *,
        gpu_metrics: bool,
        caps: WiredCaps | None,
        mps: MpsDaemonManager | None,
    ) -> None:
        self._agent = agent
        self._refresher = refresher
        self._counters = counters
        self._gpu_metrics = gpu_metrics
        self._caps = caps
        self._mps = mps

    def gpu_indexes(self) -> dict[str, int]:
        return {g.uuid: g.index for g in self._agent.state.current.inventory.gpus}

    def status(self) -> dict[str, object]:
        agent, settings, mps = self._agent, self._agent.settings, self._mps
        return build_status(
            node_name=self._refresher.hostname,
            config_name=agent.loaded.name,
            plan=agent.state.current.plan,
            snapshot=self._refresher.latest if self._gpu_metrics else None,
            gpu_metrics=self._gpu_metrics,
            pod_resources_socket=str(settings.pod_resources_socket),
            pod_resources_present=settings.pod_resources_socket.exists(),
            ready=agent.readiness(),
            caps=None if self._caps is None else self._caps.view(),
            mps_daemons=None
            if mps is None
            else [
                {"resource": d.resource, "state": d.state, "problem": d.problem}
                for d in mps.daemons()
            ],
        )

    async def on_config(self, _name: str, accepted: bool, _message: str) -> None:
        self._counters.record_config_reload(accepted)


def wire_metrics(
    agent: Agent,
    *,
    port: int,
    host: str = "0.0.0.0",
    refresher: SnapshotRefresher,
    guard: MemoryGuard | None = None,
    gpu_metrics: bool = True,
    limits: ServerLimits | None = None,
    caps: WiredCaps | None = None,
    mps: MpsDaemonManager | None = None,
) -> MetricsServer:
    """Serve Prometheus metrics, the probes and `/status`; scrapes read the latest snapshot
    and never wait on NVML. `gpu_metrics=False` serves the probes and the plugin's counters
    without gathering GPU telemetry. `refresher`: the attribution poll (`snapshot_refresher`)
    the exporter shares with the guard and the caps loop.
    """
    registry, counters = exporter_registry(refresher.read_latest if gpu_metrics else _nothing)
    pages = MetricsPages(agent, refresher, counters, gpu_metrics=gpu_metrics, caps=caps, mps=mps)
    if gpu_metrics and caps is not None:
        registry.register(CapsCollector(caps.view, pages.gpu_indexes))
    server = MetricsServer(
        registry, host=host, port=port, ready=agent.readiness, status=pages.status, limits=limits
    )
    agent.hooks.on_config.append(pages.on_config)
    agent.hooks.on_health.append(counters.record_health_transition)
    agent.hooks.services.append(
        Listener(server, "metrics_port", "metrics-listening", "/metrics").serve
    )
    if gpu_metrics:
        agent.hooks.services.append(refresher.run)
    agent.front_end.on_allocate = counters.record_allocate
    if guard is not None:
        guard.on_decision = counters.record_decision
    return server


def _nothing() -> None:
    """The exporter's snapshot source with GPU metrics off: never a snapshot."""
    return


PROBE_LIMITS = ServerLimits(max_connections=128, max_per_address=8, max_scrapes=1)
"""The probe listener's own capacity: the kubelet opens one connection per probe."""


def wire_probes(
    agent: Agent, *, port: int, host: str = "0.0.0.0", limits: ServerLimits = PROBE_LIMITS
) -> MetricsServer:
    """`/healthz` and `/readyz` on a listener of their own (`--health-port`): whatever the
    scrape port's clients do, the kubelet's probes meet only this listener's clients."""
    server = MetricsServer(
        CollectorRegistry(auto_describe=False),
        host=host,
        port=port,
        ready=agent.readiness,
        limits=limits,
        routes="probes",
    )
    agent.hooks.services.append(Listener(server, "health_port", "probes-listening").serve)
    return server
