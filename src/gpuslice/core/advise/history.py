"""What the exporter recorded, lined up on one time grid: the input every rule here reads.

Two readers feed it (Prometheus's `query_range`, a file of samples); both hand over plain
series, and the lining up happens once, here, so `--prometheus` and `--samples` cannot
disagree about what a pod used or when. A pod's memory is kept in MiB, rounded up: every
size the sharing configs speak of (replicas' shares, MPS limits, MIG profiles, DRA
quantities) is in MiB, and rounding up never sizes a pod below what it used.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpuslice.core.errors import GpusliceError
from gpuslice.core.gpumodels import MODELS
from gpuslice.core.guard import ContainerKey
from gpuslice.core.units import MIB

POD_MEMORY = "gpuslice_pod_memory_used_bytes"
POD_SM = "gpuslice_pod_sm_util_percent"
POD_ENTITLED_SM = "gpuslice_pod_entitled_sm_fraction"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
T = TypeVar("T", int, float)

MAX_GRID_POINTS = 1_000_000
"""The most steps a history spans (115 days at 10 s, 11.5 at 1 s): the replay and the
pictures walk every step, and a stray timestamp or a `--since` of years must not make a
grid to match."""
MAX_TRACE_POINTS = 20_000_000
"""The most pod-steps held (each pod from its first sample to its last): 7 times the
bench's fleet week (1,000 pods, 2.9 million samples)."""
MAX_PLAUSIBLE_MIB = 1024 * 1024
"""1 TiB: above it no GPU's memory, the bound used when a GPU's own size is not known."""
MAX_NOTES = 20

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
    warnings: tuple[str, ...] = ()
    """Samples ignored as implausible, one line per series, for the front end to show."""

    @property
    def end(self) -> float:
        return self.start + (self.points - 1) * self.step_s


def model_key(product: str) -> str:
    """A short name for a product, fit for a config name and a node label value: the
    simulator's spec name when the model is known (`h100-80gb`), else the product name
    in lower case with runs of other characters as `-`. ASCII letters and digits only:
    the name is a ConfigMap key and a label value, which Kubernetes holds to those."""
    for m in MODELS.values():
        if m.product_name == product:
            return m.key
    slug = "".join(c if c.isascii() and c.isalnum() else "-" for c in product.lower())
    slug = "-".join(part for part in slug.split("-") if part)
    return (slug or "unknown")[:63].strip("-")


def known_memory_mib(product: str) -> int | None:
    for m in MODELS.values():
        if m.product_name == product:
            return m.memory_mib
    return None


def build_history(
    series: Iterable[RawSeries],
    step_s: float,
    start: float | None = None,
    end: float | None = None,
) -> History:
    """Line the exporter's series up on a grid of `step_s` from `start` (default: the first
    pod sample) to `end` (default: the last). Samples outside that range are ignored: one
    stray timestamp must not stretch the grid to meet it. Raises AdviseError when there is
    no per-pod series at all, or when the grid would be larger than the caps."""
    if not math.isfinite(step_s) or step_s <= 0:
        raise AdviseError(f"--step: must be positive and finite, got {step_s}")
    # Finite bounds: `lo <= t <= hi` then also drops an infinite or NaN timestamp.
    lo = -sys.float_info.max if start is None else start
    hi = sys.float_info.max if end is None else end
    pod_series: list[RawSeries] = []
    fb: dict[str, dict[float, list[float]]] = {}
    models: dict[str, str] = {}
    entitled: dict[tuple[ContainerKey, str], float] = {}
    notes = _Notes()
    isfinite = math.isfinite
    for s in series:
        if s.name in (POD_MEMORY, POD_SM):
            if s.points:
                pod_series.append(s)
        elif s.name in (FB_USED, FB_FREE):
            uuid = s.labels.get("UUID", "")
            if s.labels.get("modelName"):
                models[uuid] = s.labels["modelName"]
            for t, v in s.points:
                if not (isfinite(v) and 0 <= v <= MAX_PLAUSIBLE_MIB):
                    notes.ignored(s, v, f"not a memory size in MiB (0 to {MAX_PLAUSIBLE_MIB})")
                    continue
                fb.setdefault(uuid, {}).setdefault(t, []).append(v)
        elif s.name == POD_ENTITLED_SM:
            values = [v for _, v in s.points if isfinite(v) and 0 < v <= 1]
            if values:
                entitled[_pod_key(s.labels)] = max(values)
    gpus: dict[str, GpuInfo] = {}
    for uuid in sorted({s.labels.get("UUID", "") for s in pod_series} | set(fb)):
        product = models.get(uuid, "unknown GPU")
        seen = max((sum(v) for v in fb.get(uuid, {}).values() if len(v) == 2), default=0.0)
        gpus[uuid] = GpuInfo(uuid, product, known_memory_mib(product) or int(seen))
    if start is None:
        start = min(
            (t for s in pod_series for t, _ in s.points if isfinite(t) and t <= hi),
            default=0.0,
        )
        lo = start

    # The loops below run once per sample (millions for a fleet's week): kept inline.
    memory: dict[tuple[ContainerKey, str], dict[int, int]] = {}
    sm: dict[tuple[ContainerKey, str], dict[int, float]] = {}
    ceil, inf = math.ceil, math.inf
    top_index = 0
    for s in pod_series:
        key = _pod_key(s.labels)
        if s.name == POD_MEMORY:
            target_m = memory.setdefault(key, {})
            memory_mib = gpus[key[1]].memory_mib or MAX_PLAUSIBLE_MIB
            for t, v in s.points:
                if not lo <= t <= hi:  # NaN too
                    continue
                mib = ceil(v / MIB) if 0 < v < inf else 0
                if not (isfinite(v) and v >= 0 and mib <= memory_mib):
                    notes.ignored(s, v, f"outside 0 to {memory_mib} MiB, the GPU's memory")
                    continue
                i = round((t - start) / step_s)
                if mib >= target_m.get(i, 0):
                    target_m[i] = mib
                top_index = i if i > top_index else top_index
        else:
            target_s = sm.setdefault(key, {})
            for t, v in s.points:
                if not lo <= t <= hi:
                    continue
                if not (isfinite(v) and 0 <= v <= 100):
                    notes.ignored(s, v, "outside 0 to 100 %")
                    continue
                i = round((t - start) / step_s)
                if v >= target_s.get(i, 0.0):
                    target_s[i] = v
                top_index = i if i > top_index else top_index
        if top_index >= MAX_GRID_POINTS:
            raise AdviseError(
                f"the range holds more than {MAX_GRID_POINTS:,} steps of {step_s:g} s (the "
                "most advise lines up): narrow --since/--until or raise --step"
            )
    spans = [(key, min(p), max(p)) for key, p in sorted(memory.items()) if p]
    cells = sum(last - first + 1 for _, first, last in spans)
    if cells > MAX_TRACE_POINTS:
        raise AdviseError(
            f"the pods' lifetimes add up to {cells:,} steps of {step_s:g} s, more than the "
            f"{MAX_TRACE_POINTS:,} advise holds: narrow --since/--until or raise --step"
        )
    traces = []
    for key, first, last in spans:
        sm_points = sm.get(key)
        traces.append(
            PodTrace(
                key=key[0],
                gpu_uuid=key[1],
                first=first,
                memory_mib=tuple(_filled(memory[key], first, last, 0)),
                sm_percent=None
                if sm_points is None
                else tuple(_filled(sm_points, first, last, 0.0, repeat=False)),
                entitled_sm_fraction=entitled.get(key),
            )
        )
    if not traces:
        raise AdviseError(
            f"no {POD_MEMORY} series in the range: is gpuslice's exporter scraped "
            "(`gpuslice plugin --metrics-port`), and is the range right?"
        )
    used = {t.gpu_uuid for t in traces} | set(fb)
    last_index = max(t.last for t in traces)
    return History(
        start,
        step_s,
        last_index + 1,
        {u: g for u, g in gpus.items() if u in used},
        tuple(traces),
        notes.lines(),
    )


@dataclass(slots=True)
class _Ignored:
    count: int
    value: float
    why: str


class _Notes:
    """Implausible samples, one line per series: a value the exporter cannot have written
    (negative, above the GPU's memory, not a number) is ignored, and said so, rather than
    sizing a plan on it or failing the whole run for one bad scrape."""

    def __init__(self) -> None:
        self.by_series: dict[tuple[str, tuple[tuple[str, str], ...]], _Ignored] = {}

    def ignored(self, s: RawSeries, value: float, why: str) -> None:
        key = (s.name, tuple(sorted(s.labels.items())))
        seen = self.by_series.get(key)
        if seen is None:
            self.by_series[key] = _Ignored(1, value, why)
        else:
            seen.count += 1

    def lines(self) -> tuple[str, ...]:
        """Labels as Python writes them (`repr`): a label holding a newline or a terminal
        escape is shown escaped, not acted on."""
        items = list(self.by_series.items())
        out = [
            f"ignored {n.count} implausible sample(s) of {name}{dict(labels)!r}: "
            f"{n.value!r}, {n.why}"
            for (name, labels), n in items[:MAX_NOTES]
        ]
        if len(items) > MAX_NOTES:
            out.append(f"... and samples of {len(items) - MAX_NOTES} more series")
        return tuple(out)


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
