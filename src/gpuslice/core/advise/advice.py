"""`gpuslice advise`: per GPU model, a sharing plan for every strategy from what the pods
used, each number with the ones it came from, and the history replayed at that plan.

Platform teams pick `replicas: 4` or an MPS limit by guessing and learn from OOMs or idle
GPUs; the exporter already records what each pod used on a shared GPU, so the guess can
be replaced by its history. Pure: readers build the `History`, the CLI renders `Advice`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.core.advise.history import History, model_key
from gpuslice.core.advise.migfit import MigPlan, plan_mig
from gpuslice.core.advise.replay import ReplayOutcome, replay
from gpuslice.core.advise.sizing import (
    CapsPlan,
    DraRequest,
    MpsPlan,
    TimeSlicing,
    caps_plan,
    dra_requests,
    mps,
    time_slicing,
)
from gpuslice.core.advise.stats import PodStats, pod_stats
from gpuslice.core.gpumodels import MODELS


@dataclass(frozen=True, slots=True)
class ModelAdvice:
    model: str
    key: str
    """Short name (`h100-80gb`): the named config's name and its node label value."""
    memory_mib: int
    gpus_seen: int
    pods: tuple[PodStats, ...]
    current_replicas: int | None
    """From `gpuslice_pod_entitled_sm_fraction` (1 / replicas), the count most pods had."""
    time_slicing: TimeSlicing | None
    """None when no pod can be sized (all idle or leaking)."""
    mps: MpsPlan | None
    mig: MigPlan | None
    """None when the model has no MIG (or nothing is sized)."""
    dra: tuple[DraRequest, ...]
    caps: CapsPlan | None
    """Soft and hard memory caps for the recommended replicas (drivers r615+)."""
    replay_recommended: ReplayOutcome | None
    replay_current: ReplayOutcome | None
    notes: tuple[str, ...]

    @property
    def idle(self) -> bool:
        return all(p.idle for p in self.pods)

    @property
    def leakers(self) -> tuple[PodStats, ...]:
        return tuple(p for p in self.pods if p.leak is not None and not p.idle)

    @property
    def idle_pods(self) -> tuple[PodStats, ...]:
        return tuple(p for p in self.pods if p.idle)


@dataclass(frozen=True, slots=True)
class Advice:
    start: float
    end: float
    step_s: float
    headroom_percent: float
    models: tuple[ModelAdvice, ...]


def advise(
    history: History,
    headroom_percent: float = 10.0,
    current_replicas: int | None = None,
    *,
    with_replay: bool = True,
) -> Advice:
    """`current_replicas` overrides what the entitlement series say (the replay's other
    size)."""
    by_model: dict[str, list[PodStats]] = {}
    for trace in history.pods:
        gpu = history.gpus.get(trace.gpu_uuid)
        model = gpu.model if gpu is not None else "unknown GPU"
        by_model.setdefault(model, []).append(pod_stats(trace, history.step_s))
    models = []
    for model, stats in sorted(by_model.items()):
        uuids = {s.trace.gpu_uuid for s in stats}
        memory = max((history.gpus[u].memory_mib for u in uuids if u in history.gpus), default=0)
        models.append(
            _advise_model(
                model,
                memory,
                len(uuids),
                stats,
                history.step_s,
                headroom_percent,
                current_replicas,
                with_replay,
            )
        )
    return Advice(history.start, history.end, history.step_s, headroom_percent, tuple(models))


def _advise_model(
    model: str,
    memory_mib: int,
    gpus_seen: int,
    stats: Sequence[PodStats],
    step_s: float,
    headroom: float,
    current_override: int | None,
    with_replay: bool,
) -> ModelAdvice:
    stats = sorted(stats, key=lambda s: (s.name, s.trace.key.container, s.trace.gpu_uuid))
    sized = [s for s in stats if s.sized]
    notes: list[str] = []
    current = current_override or _current(stats)
    key = model_key(model)
    known = next((m for m in MODELS.values() if m.product_name == model), None)
    geometry = known.mig if known is not None else None
    if known is not None and known.unified_memory:
        notes.append(
            f"unified memory: NVML reports no GPU memory figure for {model}, so nothing is "
            f"sized from memory (replicas, MPS limits); {len(stats)} pods not sized"
        )
        sized = []
        memory_mib = 0
    elif memory_mib <= 0:
        notes.append(
            f"no DCGM_FI_DEV_FB_USED/FB_FREE series name this GPU's model and memory: "
            f"{len(stats)} pods not sized"
        )
        sized = []
    if all(s.idle for s in stats):
        notes.append(
            f"idle: none of the {len(stats)} pods on {model} used its GPU in the range "
            "(no memory, no SM time); nothing to size, and the GPUs could be given back"
        )
    elif not sized and memory_mib > 0:
        notes.append("every pod that used the GPU leaked: nothing left to size from")
    for s in stats:
        if s.leak is not None and not s.idle:
            q = s.leak.quarter_peaks_mib
            notes.append(
                f"leaker: {s.name} grew {s.leak.rate_mib_per_h:.0f} MiB/h, its peak in each "
                f"quarter of its life {q[0]} -> {q[1]} -> {q[2]} -> {q[3]} MiB; left out of "
                "the sizing"
            )
    ts = time_slicing(sized, memory_mib, headroom) if sized else None
    traces = [s.trace for s in stats]
    rec = cur = None
    if ts is not None and with_replay:
        rec = replay(traces, memory_mib, ts.replicas, step_s)
        if current is not None:
            cur = replay(traces, memory_mib, current, step_s)
        else:
            notes.append(
                "current replicas unknown (no gpuslice_pod_entitled_sm_fraction series): "
                "pass --current-replicas to replay it"
            )
    mig = None
    if sized and geometry is not None:
        mig = plan_mig(sized, geometry, headroom)
    elif sized:
        notes.append(f"{model} has no MIG")
    return ModelAdvice(
        model=model,
        key=key,
        memory_mib=memory_mib,
        gpus_seen=gpus_seen,
        pods=tuple(stats),
        current_replicas=current,
        time_slicing=ts,
        mps=None if ts is None else mps(ts, memory_mib),
        mig=mig,
        dra=dra_requests(sized, headroom),
        caps=None
        if ts is None
        else caps_plan(ts, memory_mib, [s.name for s in stats if s.leak is not None]),
        replay_recommended=rec,
        replay_current=cur,
        notes=tuple(notes),
    )


def _current(stats: Sequence[PodStats]) -> int | None:
    counts = Counter(
        round(1 / s.trace.entitled_sm_fraction) for s in stats if s.trace.entitled_sm_fraction
    )
    if not counts:
        return None
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
