"""Memory caps as metric families (docs/metrics.md, docs/memory-guard.md).

Per GPU, which protection holds its tenants to their memory (`capped`, `guarded`, `none`:
one series per GPU with value 1, the reason it is not capped as a label); per capped
container and GPU, the soft and hard limits and the memory its cgroup uses as the driver
counts it (`currentUsed`, which covers every process of the container, the ones NVML's
process list misses included); and the window the agent measured between a container's
cgroup appearing and its limits confirmed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuslice.core.caps import LIMIT_MAX, CapsView

POD_LABELS = ["namespace", "pod", "container", "gpu", "UUID"]


def caps_families(view: CapsView, gpu_index: Mapping[str, int | None]) -> list[Metric]:
    protection = GaugeMetricFamily(
        "gpuslice_gpu_memory_protection",
        "1 for the protection that holds this GPU's tenants to their memory: capped (the "
        "driver's limits, read back), guarded (the memory guard, enforcing) or none; "
        "`reason` says why not capped.",
        labels=["gpu", "UUID", "protection", "reason"],
    )
    soft = GaugeMetricFamily(
        "gpuslice_pod_memory_soft_limit_bytes",
        "The container's soft GPU memory limit on that GPU (guaranteed; its entitlement).",
        labels=POD_LABELS,
    )
    hard = GaugeMetricFamily(
        "gpuslice_pod_memory_hard_limit_bytes",
        "The container's hard GPU memory limit on that GPU (absent when it has none).",
        labels=POD_LABELS,
    )
    used = GaugeMetricFamily(
        "gpuslice_pod_memory_capped_used_bytes",
        "GPU memory the container's cgroup uses on that GPU, as the driver counts it "
        "against its limits (nvmlDeviceGetMemoryLimits_v1 currentUsed).",
        labels=POD_LABELS,
    )
    window = GaugeMetricFamily(
        "gpuslice_memory_caps_window_seconds",
        "Seconds from a container's cgroup being created to its limits confirmed by the "
        "agent (where no CDI hook set them first): the quantiles over the agent's life.",
        labels=["quantile"],
    )
    for uuid, (kind, reason) in sorted(view.protection.items()):
        index = gpu_index.get(uuid)
        protection.add_metric(["" if index is None else str(index), uuid, kind, reason], 1)
    for (key, uuid), lim in sorted(view.limits.items()):
        index = gpu_index.get(uuid)
        labels = [key.namespace, key.pod, key.container, "" if index is None else str(index), uuid]
        soft.add_metric(labels, lim.soft_bytes)
        if lim.hard_bytes != LIMIT_MAX:
            hard.add_metric(labels, lim.hard_bytes)
        if lim.used_bytes is not None:
            used.add_metric(labels, lim.used_bytes)
    if view.windows_s:
        ordered = sorted(view.windows_s)
        for q in (0.5, 0.99, 1.0):
            window.add_metric([f"{q:g}"], ordered[min(len(ordered) - 1, int(q * len(ordered)))])
    return [protection, soft, hard, used, window]


class CapsCollector(Collector):
    """Reads the caps view on each scrape (plain data the caps loop keeps)."""

    def __init__(
        self, view: Callable[[], CapsView | None], gpu_index: Callable[[], Mapping[str, int | None]]
    ) -> None:
        self._view = view
        self._index = gpu_index

    def describe(self) -> Iterable[Metric]:
        return caps_families(CapsView({}, {}), {})

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        return iter(()) if view is None else iter(caps_families(view, self._index()))
