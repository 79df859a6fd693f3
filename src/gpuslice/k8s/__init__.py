"""Kubernetes API adapter: this node's config label, node Events, optional node labels, and
this node's pods (for per-pod metrics).

Only this package talks to the Kubernetes API (through lightkube); the agent composes it.
Every class takes an injected `lightkube.AsyncClient`, so tests point it at the in-test API
server double (`gpuslice.testing.apiserver`) over real HTTP.
"""

from gpuslice.k8s.client import ClientSettingsError, make_client
from gpuslice.k8s.events import AgentPod, NodeEvents
from gpuslice.k8s.labeling import NodeLabeler
from gpuslice.k8s.podevents import PodEvents, PodEvictor
from gpuslice.k8s.pods import NodePods
from gpuslice.k8s.watching import Backoff, NodeLabelWatcher

__all__ = [
    "AgentPod",
    "Backoff",
    "ClientSettingsError",
    "NodeEvents",
    "NodeLabelWatcher",
    "NodeLabeler",
    "NodePods",
    "PodEvents",
    "PodEvictor",
    "make_client",
]
