"""`advise -o json|yaml`: the advice as plain data, every number next to its reasons."""

from __future__ import annotations

from gpuslice.core.advise.advice import Advice, ModelAdvice
from gpuslice.core.advise.replay import ReplayOutcome
from gpuslice.core.advise.stats import PodStats


def advice_to_dict(advice: Advice) -> dict[str, object]:
    return {
        "range": {"start": advice.start, "end": advice.end, "step_s": advice.step_s},
        "headroom_percent": advice.headroom_percent,
        "models": [_model(m) for m in advice.models],
    }


def _model(m: ModelAdvice) -> dict[str, object]:
    ts = m.time_slicing
    return {
        "model": m.model,
        "config_name": m.key,
        "memory_mib": m.memory_mib,
        "gpus_seen": m.gpus_seen,
        "idle": m.idle,
        "current_replicas": m.current_replicas,
        "leakers": [p.name for p in m.leakers],
        "idle_pods": [p.name for p in m.idle_pods],
        "time_slicing": None
        if ts is None
        else {
            "replicas": ts.replicas,
            "share_mib": ts.share_mib,
            "need_mib": ts.need_mib,
            "sized_by": ts.sized_by,
            "why": list(ts.why),
        },
        "mps": None
        if m.mps is None
        else {
            "replicas": m.mps.replicas,
            "pinned_memory_limit_mib": m.mps.pinned_limit_mib,
            "active_thread_percentage": m.mps.active_thread_percentage,
            "why": list(m.mps.why),
        },
        "mig": None
        if m.mig is None
        else {
            "layouts": list(m.mig.layouts),
            "instances": dict(m.mig.counts),
            "pods": [
                {"pod": f.pod, "container": f.container, "profile": f.profile, "why": f.why}
                for f in m.mig.fits
            ],
            "why": list(m.mig.why),
        },
        "dra": [
            {"pod": d.pod, "container": d.container, "memory": d.quantity, "why": d.why}
            for d in m.dra
        ],
        "caps": None
        if m.caps is None
        else {
            "soft_limit_mib": m.caps.soft_mib,
            "hard_limit_mib": m.caps.hard_mib,
            "policy": m.caps.policy,
            "why": list(m.caps.why),
        },
        "replay": {
            "recommended": _replay(m.replay_recommended),
            "current": _replay(m.replay_current),
        },
        "pods": [_pod(p) for p in m.pods],
        "notes": list(m.notes),
    }


def _replay(r: ReplayOutcome | None) -> dict[str, object] | None:
    if r is None:
        return None
    return {
        "replicas": r.replicas,
        "gpus": r.gpus,
        "whole_gpus": r.whole_gpus,
        "gpus_saved": r.gpus_saved,
        "oom_without_guard": list(r.oom_without_guard),
        "stopped_by_guard": list(r.stopped_by_guard),
        "oom_with_guard": list(r.oom_with_guard),
        "capped_with_caps": list(r.capped_with_caps),
        "oom_with_caps": list(r.oom_with_caps),
    }


def _pod(p: PodStats) -> dict[str, object]:
    return {
        "pod": p.name,
        "container": p.trace.key.container,
        "gpu": p.trace.gpu_uuid,
        "peak_mib": p.peak_mib,
        "p99_mib": p.p99_mib,
        "mean_sm_percent": None if p.mean_sm_percent is None else round(p.mean_sm_percent, 2),
        "active_s": p.active_s,
        "lifetime_s": p.lifetime_s,
        "idle": p.idle,
        "leak_mib_per_h": None if p.leak is None else round(p.leak.rate_mib_per_h, 1),
    }
