"""The Prometheus collector: turns the latest `MetricsSnapshot` into metric families.

It never calls the backend or the kubelet; a scrape costs one pass over frozen data. Names
follow dcgm-exporter (`DCGM_FI_DEV_*`, labels `gpu`, `UUID`, `modelName`, `Hostname`) so
existing dashboards and alerts keep working; the per-pod families are gpuslice's own and
share one label set, so "a container using more than its share" is a single comparison:

    gpuslice_pod_memory_used_bytes > gpuslice_pod_entitled_memory_bytes
    gpuslice_pod_sm_util_percent / 100 > gpuslice_pod_entitled_sm_fraction

In DRA mode a container's series also carry `claim="<namespace>/<name>"`, the
ResourceClaim its devices on that GPU come from (`claim_of`). A device-plugin holder's
series have no `claim` label at all, which PromQL reads as `claim=""`: the device-plugin
mode's series stay exactly as they were, and `on(claim)` joins work on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuslice.core.dra.claimplan import CLAIM_PREFIX
from gpuslice.metrics.snapshot import MetricsSnapshot

GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]
POD_LABELS = ["namespace", "pod", "container", "gpu", "UUID"]
CLAIM_LABEL = "claim"
"""The resource name prefix of a claims plan's holders (`claim:<namespace>/<name>`)."""

_GPU_FAMILIES: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none)."),
)
_POD_FAMILIES: tuple[tuple[str, str], ...] = (
    ("gpuslice_pod_memory_used_bytes", "GPU memory used by the container's processes."),
    (
        "gpuslice_pod_sm_util_percent",
        "Sum of the container's processes' SM utilisation samples, in % of the whole GPU "
        "(absent on MIG, where NVML gives no per-process samples).",
    ),
    (
        "gpuslice_pod_entitled_memory_bytes",
        "GPU memory the container's devices entitle it to: whole GPU, MIG device, MPS pinned "
        "limit, or a time-slicing fair share (memory/replicas, not enforced).",
    ),
    (
        "gpuslice_pod_entitled_sm_fraction",
        "Share of the GPU's SMs the container's devices entitle it to (1/replicas for "
        "time-slicing, the active thread percentage for MPS, MIG SMs/GPU SMs).",
    ),
    (
        "gpuslice_pod_memory_over_share",
        "1 while the container uses more GPU memory than its entitlement on that GPU, else 0 "
        "(borrowing under time-slicing; the memory guard reclaims it under pressure).",
    ),
)


def _families() -> dict[str, GaugeMetricFamily]:
    fams = {name: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc in _GPU_FAMILIES}
    fams.update(
        {name: GaugeMetricFamily(name, doc, labels=POD_LABELS) for name, doc in _POD_FAMILIES}
    )
    fams["gpuslice_advertised_devices"] = GaugeMetricFamily(
        "gpuslice_advertised_devices",
        "Devices (replicas, MIG devices, GPUs) advertised to the kubelet per resource.",
        labels=["resource"],
    )
    fams["gpuslice_allocated_devices"] = GaugeMetricFamily(
        "gpuslice_allocated_devices",
        "Advertised devices that PodResources lists as held by a container, per resource.",
        labels=["resource"],
    )
    fams["gpuslice_unattributed_gpu_processes"] = GaugeMetricFamily(
        "gpuslice_unattributed_gpu_processes",
        "GPU processes that could not be tied to a container, by GPU and reason "
        "(not-in-a-pod, no-holder, ambiguous).",
        labels=["UUID", "reason"],
    )
    fams["gpuslice_metrics_snapshot_timestamp_seconds"] = GaugeMetricFamily(
        "gpuslice_metrics_snapshot_timestamp_seconds",
        "When the snapshot behind these metrics was taken (Unix time).",
    )
    return fams


def claim_of(resources: Iterable[str]) -> str:
    """`<namespace>/<name>` of the claims among a holder's resources, "" when none is one
    (a device-plugin resource). A container holding devices of several claims on one GPU
    (its memory there cannot be split between them) gets them sorted, comma-separated."""
    claims = sorted({r.removeprefix(CLAIM_PREFIX) for r in resources if r.startswith(CLAIM_PREFIX)})
    return ",".join(claims)


class SnapshotCollector(Collector):
    """Reads `latest()` on each scrape; exports nothing until the first snapshot exists."""

    def __init__(self, latest: Callable[[], MetricsSnapshot | None]) -> None:
        self._latest = latest

    def describe(self) -> Iterable[Metric]:
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        snap = self._latest()
        if snap is None:
            return iter(())
        fams = _families()
        for g in snap.gpus:
            labels = ["" if g.index is None else str(g.index), g.uuid, g.model, snap.hostname]
            s = g.status
            # A unified-memory GPU has no framebuffer figures: no series, as DCGM has none.
            if s.memory_used_mib is not None:
                fams["DCGM_FI_DEV_FB_USED"].add_metric(labels, s.memory_used_mib)
            if s.memory_free_mib is not None:
                fams["DCGM_FI_DEV_FB_FREE"].add_metric(labels, s.memory_free_mib)
            if s.gpu_util_percent is not None:
                fams["DCGM_FI_DEV_GPU_UTIL"].add_metric(labels, s.gpu_util_percent)
            if s.temperature_c is not None:
                fams["DCGM_FI_DEV_GPU_TEMP"].add_metric(labels, s.temperature_c)
            if s.power_w is not None:
                fams["DCGM_FI_DEV_POWER_USAGE"].add_metric(labels, s.power_w)
            fams["DCGM_FI_DEV_XID_ERRORS"].add_metric(labels, s.last_xid or 0)
        # GPUs with no memory figure (unified memory): no memory share to export or exceed.
        no_memory = {g.uuid for g in snap.gpus if g.memory_total_mib <= 0}
        for u in snap.attribution.usages:
            pod_labels = {
                "namespace": u.namespace,
                "pod": u.pod,
                "container": u.container,
                "gpu": str(u.gpu_index),
                "UUID": u.gpu_uuid,
            }
            claim = claim_of(u.resources)
            if claim:
                pod_labels[CLAIM_LABEL] = claim
            ent = u.entitlement
            shared_memory = u.gpu_uuid not in no_memory
            values: list[tuple[str, float | None]] = [
                ("gpuslice_pod_memory_used_bytes", u.memory_used_bytes),
                ("gpuslice_pod_sm_util_percent", u.sm_util_percent),
                ("gpuslice_pod_entitled_memory_bytes", ent.memory_bytes if shared_memory else None),
                (
                    "gpuslice_pod_memory_over_share",
                    int(u.memory_used_bytes > ent.memory_bytes) if shared_memory else None,
                ),
                ("gpuslice_pod_entitled_sm_fraction", ent.sm_fraction),
            ]
            for name, value in values:
                if value is not None:
                    fams[name].add_sample(name, pod_labels, value)
        for resource, n in sorted(snap.advertised.items()):
            fams["gpuslice_advertised_devices"].add_metric([resource], n)
        for resource, n in sorted(snap.allocated.items()):
            fams["gpuslice_allocated_devices"].add_metric([resource], n)
        unattributed: dict[tuple[str, str], int] = {}
        for p in snap.attribution.unattributed:
            key = (p.gpu_uuid, p.reason)
            unattributed[key] = unattributed.get(key, 0) + 1
        for (uuid, reason), n in sorted(unattributed.items()):
            fams["gpuslice_unattributed_gpu_processes"].add_metric([uuid, reason], n)
        fams["gpuslice_metrics_snapshot_timestamp_seconds"].add_metric([], snap.taken_at)
        return iter(fams.values())
