"""`gpuslice advise` with caps: the soft and hard limits it recommends per GPU model, and
what the replay says the driver's caps would have done with the same history."""

from __future__ import annotations

import random

from gpuslice.backends.simulated.models import MODELS
from gpuslice.core.advise import RawSeries, advise, build_history
from gpuslice.core.advise.history import PodTrace
from gpuslice.core.advise.replay import replay
from gpuslice.core.advise.report import advice_to_dict
from gpuslice.core.guard import ContainerKey

MIB = 1024 * 1024
H100 = MODELS["h100-80gb"]
STEP = 15.0


def trace(name: str, mib: list[int], first: int = 0) -> PodTrace:
    return PodTrace(ContainerKey("ns", name, "main"), "GPU-a", first, tuple(mib), None)


def pod(name: str, mib: list[int]) -> list[RawSeries]:
    labels = {"namespace": "ns", "pod": name, "container": "main", "UUID": "GPU-a"}
    times = [1000.0 + i * STEP for i in range(len(mib))]
    return [
        RawSeries("gpuslice_pod_memory_used_bytes", labels,
                  [(t, v * MIB) for t, v in zip(times, mib, strict=True)]),
        RawSeries("gpuslice_pod_sm_util_percent", labels,
                  [(t, 30.0) for t in times]),
    ]  # fmt: skip


def gpu() -> list[RawSeries]:
    labels = {"UUID": "GPU-a", "modelName": H100.product_name, "gpu": "0"}
    return [
        RawSeries("DCGM_FI_DEV_FB_USED", labels, [(1000.0, 0.0)]),
        RawSeries("DCGM_FI_DEV_FB_FREE", labels, [(1000.0, 1.0)]),
    ]


def flat(peak: int, n: int = 40, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    values = [peak - rng.randrange(1, 600) for _ in range(n)]
    values[rng.randrange(n)] = peak
    return values


def test_replay_with_caps_the_leaker_fails_at_its_own_cap_and_nobody_else_dies() -> None:
    n = 200
    steady = [trace(f"s{i}", [9000] * n) for i in range(6)]
    leaker = trace("leak", [4000 + 200 * i for i in range(n)])
    out = replay([*steady, leaker], H100.memory_mib, 8, STEP)
    assert out.oom_without_guard  # the neighbours' loss it is compared with
    assert out.capped_with_caps == ("ns/leak",)
    assert out.oom_with_caps == ()


def test_replay_with_caps_a_pod_above_its_share_is_capped_not_its_neighbour() -> None:
    # 5 x 20000 MiB on 5 replicas of an H100: each share is 16311 MiB, so each pod hits its
    # own cap; without caps only the last to start dies, of OOM.
    pods = [trace(f"p{i}", [20000] * 30) for i in range(5)]
    out = replay(pods, H100.memory_mib, 5, STEP)
    assert len(out.oom_without_guard) == 1
    assert len(out.capped_with_caps) == 5
    assert out.oom_with_caps == ()


def test_advise_recommends_soft_and_hard_at_the_share() -> None:
    series = [*gpu(), *pod("a", flat(10000)), *pod("b", flat(7000, seed=1))]
    advice = advise(build_history(series, STEP))
    [m] = advice.models
    assert m.time_slicing is not None
    assert m.caps is not None
    assert (m.caps.soft_mib, m.caps.hard_mib, m.caps.policy) == (
        m.time_slicing.share_mib,
        m.time_slicing.share_mib,
        "strict",
    )
    report = advice_to_dict(advice)["models"][0]  # type: ignore[index]
    assert report["caps"]["soft_limit_mib"] == m.time_slicing.share_mib
    assert "capped_with_caps" in report["replay"]["recommended"]
