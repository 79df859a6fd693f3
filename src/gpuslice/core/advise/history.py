"""What the exporter recorded, lined up on one time grid: the input every rule here reads.

Two readers feed it (Prometheus's `query_range`, a file of samples); both hand over plain
series, and the lining up happens once, here, so `--prometheus` and `--samples` cannot
disagree about what a pod used or when. A pod's memory is kept in MiB, rounded up: every
size the sharing configs speak of (replicas' shares, MPS limits, MIG profiles, DRA
quantities) is in MiB, and rounding up never sizes a pod below what it used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpuslice.core.errors import GpusliceError
from gpuslice.core.gpumodels import MODELS
from gpuslice.core.guard import ContainerKey

MIB = 1024 * 1024

POD_MEMORY = "gpuslice_pod_memory_used_bytes"
POD_SM = "gpuslice_pod_sm_util_percent"
POD_ENTITLED_SM = "gpuslice_pod_entitled_sm_fraction"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
T = TypeVar("T", int, float)

SERIES_READ = (POD_MEMORY, POD_SM, POD_ENTITLED_SM, FB_USED, FB_FREE)
"""The exporter's series `advise` reads; anything else in the input is ignored."""


class AdviseError(GpusliceError):
    """Input `advise` cannot size anything from: no series, unreadable samples, a
    Prometheus that refused or could not be reached."""


@dataclass(frozen=True, slots=True)
class RawSeries:
    """One series as a reader got it: its metric name, labels and (time, value) points."""

    name: str
    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: str
    model: str
    """The product name, as dcgm-exporter's `modelName` label gives it."""
    memory_mib: int
    """The model table's memory when the product is known (what `describe` and the plugin
    divide), else the largest FB_USED + FB_FREE seen."""


@dataclass(frozen=True, slots=True)
class PodTrace:
    """One container's use of one GPU, from its first scrape to its last."""

    key: ContainerKey
    gpu_uuid: str
    first: int
    """Grid index of its first sample."""
    memory_mib: tuple[int, ...]
    """One value per grid step from `first`; a missed scrape repeats the previous value."""
    sm_percent: tuple[float, ...] | None
    """Aligned with `memory_mib`; None when the exporter had no SM samples (MIG)."""
    entitled_sm_fraction: float | None = None

    @property
    def last(self) -> int:
        return self.first + len(self.memory_mib) - 1

    @property
    def name(self) -> str:
        return f"{self.key.namespace}/{self.key.pod}"


@dataclass(frozen=True, slots=True)
class History:
    start: float
    """Unix time of grid index 0."""
    step_s: float
    points: int
    gpus: Mapping[str, GpuInfo]
    pods: tuple[PodTrace, ...]

    @property
    def end(self) -> float:
        return self.start + (self.points - 1) * self.step_s


def model_key(product: str) -> str:
    """A short name for a product, fit for a config name and a node label value: the
    simulator's spec name when the model is known (`h100-80gb`), else the product name
    in lower case with runs of other characters as `-`."""
    for m in MODELS.values():
        if m.product_name == product:
            return m.key
    slug = "".join(c if c.isalnum() else "-" for c in product.lower())
    slug = "-".join(part for part in slug.split("-") if part)
    return (slug or "unknown")[:63].strip("-")


def known_memory_mib(product: str) -> int | None:
    for m in MODELS.values():
        if m.product_name == product:
            return m.memory_mib
    return None


def build_history(
    series: Iterable[RawSeries], step_s: float, start: float | None = None
) -> History:
    """Line the exporter's series up on a grid of `step_s` from `start` (default: the first
    pod sample). Raises AdviseError when there is no per-pod series at all."""
    if step_s <= 0:
        raise AdviseError(f"the step must be positive, got {step_s}")
    pod_series: list[RawSeries] = []
    fb: dict[str, dict[float, list[float]]] = {}
    models: dict[str, str] = {}
    entitled: dict[tuple[ContainerKey, str], float] = {}
    for s in series:
        if s.name in (POD_MEMORY, POD_SM):
            if s.points:
                pod_series.append(s)
        elif s.name in (FB_USED, FB_FREE):
            uuid = s.labels.get("UUID", "")
            if s.labels.get("modelName"):
                models[uuid] = s.labels["modelName"]
            for t, v in s.points:
                fb.setdefault(uuid, {}).setdefault(t, []).append(v)
        elif s.name == POD_ENTITLED_SM:
            values = [v for _, v in s.points if v > 0 and math.isfinite(v)]
            if values:
                entitled[_pod_key(s.labels)] = max(values)
    memory_series = [s for s in pod_series if s.name == POD_MEMORY]
    if not memory_series:
        raise AdviseError(
            f"no {POD_MEMORY} series in the range: is gpuslice's exporter scraped "
            "(`gpuslice plugin --metrics-port`), and is the range right?"
        )
    if start is None:
        start = min(t for s in pod_series for t, _ in s.points)

    # The loops below run once per sample (millions for a fleet's week): kept inline.
    memory: dict[tuple[ContainerKey, str], dict[int, int]] = {}
    sm: dict[tuple[ContainerKey, str], dict[int, float]] = {}
    isfinite, ceil = math.isfinite, math.ceil
    for s in pod_series:
        key = _pod_key(s.labels)
        if s.name == POD_MEMORY:
            target_m = memory.setdefault(key, {})
            for t, v in s.points:
                i = round((t - start) / step_s)
                if i >= 0 and isfinite(v):
                    mib = ceil(v / MIB) if v > 0 else 0
                    if mib >= target_m.get(i, 0):
                        target_m[i] = mib
        else:
            target_s = sm.setdefault(key, {})
            for t, v in s.points:
                i = round((t - start) / step_s)
                if i >= 0 and isfinite(v):
                    pct = v if v > 0 else 0.0
                    if pct >= target_s.get(i, 0.0):
                        target_s[i] = pct
    traces = []
    for key, points in sorted(memory.items()):
        if not points:
            continue
        first, last = min(points), max(points)
        sm_points = sm.get(key)
        traces.append(
            PodTrace(
                key=key[0],
                gpu_uuid=key[1],
                first=first,
                memory_mib=tuple(_filled(points, first, last, 0)),
                sm_percent=None
                if sm_points is None
                else tuple(_filled(sm_points, first, last, 0.0, repeat=False)),
                entitled_sm_fraction=entitled.get(key),
            )
        )
    gpus = {}
    for uuid in sorted({t.gpu_uuid for t in traces} | set(fb)):
        product = models.get(uuid, "unknown GPU")
        seen = max((sum(v) for v in fb.get(uuid, {}).values() if len(v) == 2), default=0.0)
        gpus[uuid] = GpuInfo(uuid, product, known_memory_mib(product) or int(seen))
    last_index = max((t.last for t in traces), default=0)
    return History(start, step_s, last_index + 1, gpus, tuple(traces))


def _pod_key(labels: Mapping[str, str]) -> tuple[ContainerKey, str]:
    return (
        ContainerKey(
            labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", "")
        ),
        labels.get("UUID", ""),
    )


def _filled(
    points: Mapping[int, T], first: int, last: int, empty: T, *, repeat: bool = True
) -> list[T]:
    """Values from `first` to `last`: a missed scrape repeats the previous memory (a pod
    does not free its memory between two scrapes) but counts as no SM use."""
    out: list[T] = []
    previous = empty
    for i in range(first, last + 1):
        value = points.get(i)
        if value is None:
            value = previous if repeat else empty
        out.append(value)
        previous = value
    return out
