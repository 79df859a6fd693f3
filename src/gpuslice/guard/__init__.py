"""The memory guard adapter: carries out the pure policy's decisions on this node.

Signals go to a container's processes only after their cgroup is checked again, through
pidfds (`signals`); the loop (`enforcement`) logs, counts and posts every decision. The
Kubernetes side (Events, the Eviction API) and the GPU readings are injected callables, so
this package imports no other adapter.
"""

from gpuslice.guard.enforcement import GuardView, MemoryGuard
from gpuslice.guard.signals import ProcessSignaller, SignalReport, Target, own_pod_uid

__all__ = [
    "GuardView",
    "MemoryGuard",
    "ProcessSignaller",
    "SignalReport",
    "Target",
    "own_pod_uid",
]
