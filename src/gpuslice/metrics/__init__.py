"""Prometheus metrics: per-GPU (DCGM names), per-pod attribution, the plugin's own counters.

`exporter_registry` is the one-call wiring the agent uses: a fresh registry (never the
process-global default) holding the snapshot collector and the plugin counters.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gpuslice.metrics.collector import SnapshotCollector
from gpuslice.metrics.plugin import PluginMetrics
from gpuslice.metrics.server import MetricsServer
from gpuslice.metrics.snapshot import MetricsSnapshot, SnapshotRefresher


def exporter_registry(
    latest: Callable[[], MetricsSnapshot | None],
) -> tuple[CollectorRegistry, PluginMetrics]:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(latest))
    return registry, PluginMetrics(registry)


__all__ = [
    "MetricsServer",
    "MetricsSnapshot",
    "PluginMetrics",
    "SnapshotCollector",
    "SnapshotRefresher",
    "exporter_registry",
]
