"""Counters for what the plugin itself does: Allocate calls, health changes, reloads.

The agent and the kubelet servers hold one `PluginMetrics` (built on the registry the
exporter serves) and call its methods; nothing here is global.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, Info

from gpuslice import __version__
from gpuslice.core.guard.model import Decision

ALLOCATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Allocate is answered from memory: most calls take well under a millisecond to a few ms."""


def _result(ok: bool) -> str:
    return "success" if ok else "error"


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # which agent answers: a rollout half done shows as two versions across the nodes
        Info("gpuslice_build", "The agent's version (value 1).", registry=registry).info(
            {"version": __version__}
        )
        self.allocate_requests = Counter(
            "gpuslice_allocate_requests",
            "Allocate calls from the kubelet, by resource and result (success|error).",
            ["resource", "result"],
            registry=registry,
        )
        self.allocate_duration = Histogram(
            "gpuslice_allocate_duration_seconds",
            "Time to answer an Allocate call.",
            ["resource"],
            buckets=ALLOCATE_BUCKETS,
            registry=registry,
        )
        self.health_transitions = Counter(
            "gpuslice_health_transitions",
            "Physical devices changing health, by device UUID and new state (healthy|unhealthy).",
            ["UUID", "to"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "gpuslice_config_reloads",
            "Config reload attempts, by result (success: applied, error: rejected and the "
            "previous plan kept).",
            ["result"],
            registry=registry,
        )
        self.memory_guard_decisions = Counter(
            "gpuslice_memory_guard_decisions",
            "Memory guard decisions, by kind (over-share: a container went over its share; "
            "reclaim: it was stopped, or would be in observe mode; escalate: SIGKILL after "
            "the grace) and whether it was enforced (true|false).",
            ["kind", "enforced"],
            registry=registry,
        )

    def record_allocate(self, resource: str, ok: bool, seconds: float) -> None:
        self.allocate_requests.labels(resource, _result(ok)).inc()
        self.allocate_duration.labels(resource).observe(seconds)

    def record_health_transition(self, device_uuid: str, healthy: bool) -> None:
        self.health_transitions.labels(device_uuid, "healthy" if healthy else "unhealthy").inc()

    def record_config_reload(self, ok: bool) -> None:
        self.config_reloads.labels(_result(ok)).inc()

    def record_guard_decision(self, kind: str, enforced: bool) -> None:
        self.memory_guard_decisions.labels(kind, "true" if enforced else "false").inc()

    def record_decision(self, decision: Decision) -> None:
        """The guard's `on_decision`."""
        self.record_guard_decision(decision.kind, decision.enforced)
