"""The advise core on series built in the test: sizing rules, leaks, MIG, replay."""

from __future__ import annotations

import random

import pytest

from gpuslice.backends.simulated.layout import place
from gpuslice.backends.simulated.models import MODELS
from gpuslice.core.advise import AdviseError, RawSeries, advise, build_history, parse_duration
from gpuslice.core.advise.history import PodTrace
from gpuslice.core.advise.leaks import find_leak
from gpuslice.core.advise.replay import replay
from gpuslice.core.advise.sizing import MAX_REPLICAS
from gpuslice.core.errors import GpusliceError
from gpuslice.core.guard import ContainerKey
from gpuslice.core.units import MIB

H100 = MODELS["h100-80gb"]
STEP = 15.0


def pod(name: str, mib: list[int], uuid: str = "GPU-a", start: int = 0) -> list[RawSeries]:
    labels = {"namespace": "ns", "pod": name, "container": "main", "UUID": uuid}
    times = [1000.0 + (start + i) * STEP for i in range(len(mib))]
    return [
        RawSeries(
            "gpuslice_pod_memory_used_bytes",
            labels,
            [(t, v * MIB) for t, v in zip(times, mib, strict=True)],
        ),
        RawSeries(
            "gpuslice_pod_sm_util_percent",
            labels,
            [(t, 30.0 if v else 0.0) for t, v in zip(times, mib, strict=True)],
        ),
    ]


def gpu(
    uuid: str = "GPU-a", product: str = H100.product_name, used: float = 0.0, free: float = 1.0
) -> list[RawSeries]:
    labels = {"UUID": uuid, "modelName": product, "gpu": "0"}
    return [
        RawSeries("DCGM_FI_DEV_FB_USED", labels, [(1000.0, used)]),
        RawSeries("DCGM_FI_DEV_FB_FREE", labels, [(1000.0, free)]),
    ]


def flat(peak: int, n: int = 40, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    values = [peak - rng.randrange(1, 600) for _ in range(n)]
    values[rng.randrange(n)] = peak
    return values


def test_the_largest_share_that_holds_every_peak_plus_headroom() -> None:
    series = gpu()
    for i in range(6):
        series += pod(f"p{i}", flat(9 * 1024, seed=i))
    m = advise(build_history(series, STEP), 10.0).models[0]
    assert m.time_slicing is not None
    # 9216 MiB + 10 % = 10138 MiB; 81559 / 8 = 10194 holds it, 81559 / 9 = 9062 does not
    assert (m.time_slicing.replicas, m.time_slicing.need_mib) == (8, 10138)
    assert m.mps is not None
    assert (m.mps.replicas, m.mps.pinned_limit_mib, m.mps.active_thread_percentage) == (
        8,
        10194,
        12,
    )
    assert [d.quantity for d in m.dra] == ["10138Mi"] * 6
    assert any("/ 9 = 9062 MiB does not" in w for w in m.time_slicing.why)


@pytest.mark.parametrize(
    ("peak", "headroom", "replicas"),
    [
        (20 * 1024, 0, 3),
        (20 * 1024, 10, 3),
        (40 * 1024, 0, 1),
        (10, 0, MAX_REPLICAS),
        (9000, 0, 9),
        (9000, 1, 8),
    ],
)
def test_replicas_follow_the_largest_peak(peak: int, headroom: float, replicas: int) -> None:
    series = (
        gpu()
        + pod("big", flat(peak, seed=1) if peak > 600 else [peak] * 40)
        + pod("small", [5] * 40)
    )
    m = advise(build_history(series, STEP), headroom, with_replay=False).models[0]
    assert m.time_slicing is not None
    assert m.time_slicing.replicas == replicas
    assert m.time_slicing.sized_by == "ns/big"


def test_a_leaker_is_named_and_not_sized() -> None:
    leak = [2048 + 200 * i for i in range(60)]
    series = gpu() + pod("steady", flat(4096)) + pod("leaky", leak)
    m = advise(build_history(series, STEP), 10.0).models[0]
    assert [p.name for p in m.leakers] == ["ns/leaky"]
    assert m.time_slicing is not None
    assert m.time_slicing.sized_by == "ns/steady"
    assert any("leaker: ns/leaky" in n for n in m.notes)


@pytest.mark.parametrize(
    "memory",
    [
        [8000] * 50,  # loaded at once, held
        [min(8000, 500 * i) for i in range(50)],  # a cache filling up to a cap
        [4000 if i % 7 else 9000 for i in range(50)],  # bursts to the same size
        [1000 + 200 * i for i in range(5)],  # too short to judge
    ],
)
def test_what_is_not_a_leak(memory: list[int]) -> None:
    assert find_leak(memory, STEP) is None


def test_growth_to_the_end_is_a_leak_with_its_rate() -> None:
    leak = find_leak([1000 + 10 * i for i in range(400)], STEP)
    assert leak is not None
    assert leak.rate_mib_per_h == pytest.approx(10 * 3600 / STEP, rel=0.02)


def test_idle_pods_make_an_idle_model_with_nothing_to_size() -> None:
    series = gpu() + pod("a", [0] * 30) + pod("b", [0] * 30)
    m = advise(build_history(series, STEP)).models[0]
    assert m.idle
    assert m.time_slicing is None
    assert m.mps is None
    assert m.mig is None
    assert m.dra == ()
    assert [p.name for p in m.idle_pods] == ["ns/a", "ns/b"]


def test_an_idle_pod_beside_busy_ones_is_named_not_sized() -> None:
    series = gpu() + pod("busy", flat(8000)) + pod("idle", [0] * 40)
    m = advise(build_history(series, STEP)).models[0]
    assert not m.idle
    assert [p.name for p in m.idle_pods] == ["ns/idle"]
    assert [d.pod for d in m.dra] == ["ns/busy"]


def test_the_mig_layout_is_one_the_simulator_places() -> None:
    series = gpu()
    peaks = [3000, 3000, 9000, 15000, 15000, 30000, 30000]
    for i, p in enumerate(peaks):
        series += pod(f"p{i}", flat(p, seed=i))
    m = advise(build_history(series, STEP), 0.0, with_replay=False).models[0]
    assert m.mig is not None
    fits = {f.pod: f.profile for f in m.mig.fits}
    assert fits["ns/p0"] == "1g.10gb"
    assert fits["ns/p3"] == "1g.20gb"
    assert fits["ns/p5"] == "3g.40gb"
    placed = [inst.profile.name for layout in m.mig.layouts for inst in place(layout, H100)]
    for profile in set(fits.values()):
        assert profile is not None
        assert placed.count(profile) >= list(fits.values()).count(profile)


def test_a_model_without_mig_gets_no_layout() -> None:
    series = gpu(product="NVIDIA L40S") + pod("a", flat(8000))
    m = advise(build_history(series, STEP)).models[0]
    assert m.mig is None
    assert m.memory_mib == 46068
    assert any("has no MIG" in n for n in m.notes)


def test_an_unknown_product_uses_the_memory_dcgm_reports() -> None:
    series = gpu(product="Future GPU 9000", used=1000.0, free=31000.0) + pod("a", flat(7000))
    m = advise(build_history(series, STEP)).models[0]
    assert (m.memory_mib, m.key) == (32000, "future-gpu-9000")


def test_a_missed_scrape_keeps_the_memory_and_counts_no_sm() -> None:
    s = pod("a", [100, 200, 300, 400])
    memory = RawSeries(s[0].name, s[0].labels, [p for i, p in enumerate(s[0].points) if i != 2])
    sm = RawSeries(s[1].name, s[1].labels, [p for i, p in enumerate(s[1].points) if i != 2])
    h = build_history([*gpu(), memory, sm], STEP)
    assert h.pods[0].memory_mib == (100, 200, 200, 400)
    assert h.pods[0].sm_percent == (30.0, 30.0, 0.0, 30.0)


def test_no_pod_series_is_an_error_that_says_so() -> None:
    with pytest.raises(AdviseError, match="no gpuslice_pod_memory_used_bytes series"):
        build_history(gpu(), STEP)


def trace(name: str, mib: list[int], first: int = 0) -> PodTrace:
    return PodTrace(ContainerKey("ns", name, "main"), "GPU-a", first, tuple(mib), None)


def test_replay_the_leaker_kills_a_neighbour_without_the_guard_and_is_stopped_with_it() -> None:
    n = 200
    steady = [trace(f"s{i}", [9000] * n) for i in range(6)]
    leaker = trace("leak", [4000 + 200 * i for i in range(n)])
    out = replay([*steady, leaker], H100.memory_mib, 8, STEP)
    assert out.gpus == 1
    assert out.whole_gpus == 7
    assert out.gpus_saved == 6
    assert out.oom_without_guard  # the card fills: someone's allocation fails
    assert out.stopped_by_guard == ("ns/leak",)
    assert out.oom_with_guard == ()


def test_replay_places_by_replicas_and_frees_slots_when_pods_end() -> None:
    early = [trace(f"e{i}", [1000] * 10) for i in range(4)]
    late = [trace(f"l{i}", [1000] * 10, first=20) for i in range(4)]
    out = replay([*early, *late], H100.memory_mib, 2, STEP)
    assert (out.gpus, out.whole_gpus) == (2, 4)
    assert out.oom_without_guard == out.stopped_by_guard == ()


def test_replay_too_many_replicas_for_the_peaks_costs_pods() -> None:
    pods = [trace(f"p{i}", [20000] * 30) for i in range(5)]
    out = replay(pods, H100.memory_mib, 5, STEP)
    assert len(out.oom_without_guard) == 1  # 5 x 20000 MiB > 81559 MiB: the last to start
    assert replay(pods, H100.memory_mib, 4, STEP).oom_without_guard == ()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("24h", 86400), ("7d", 604800), ("1h30m", 5400), ("30", 30)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1x", "-5m", "0s", "5m3"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(GpusliceError):
        parse_duration(text)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("replicas", [2, 6, 12])
def test_leaving_quiet_gpus_out_of_the_poll_changes_no_outcome(seed: int, replicas: int) -> None:
    """The replay's shortcut against the policy shown every GPU at every poll, on seeded
    fleets with leakers and peaks that overrun the smaller shares."""
    rng = random.Random(seed)
    traces = []
    for i in range(30):
        first = rng.randrange(0, 200)
        n = rng.randrange(20, 200)
        roll = rng.random()
        if roll < 0.2:
            mib = [2000 + rng.randrange(50, 400) * j for j in range(n)]
        else:
            peak = rng.randrange(2000, 30000)
            mib = [peak - rng.randrange(0, 1500) if j % 9 else peak for j in range(n)]
        traces.append(trace(f"p{i}", mib, first))
    fast = replay(traces, H100.memory_mib, replicas, STEP)
    full = replay(traces, H100.memory_mib, replicas, STEP, skip_quiet=False)
    assert fast == full
    if replicas == 12:
        assert full.stopped_by_guard  # the comparison covers the guard acting


def test_a_recorded_demand_asks_for_what_was_scraped_then() -> None:
    from gpuslice.core.gpumemory import RecordedDemand

    demand = RecordedDemand((100, 200, 300), STEP)
    asked = [demand.wanted_mib(age) for age in (0.0, 14.9, 15.0, 29.0, 30.0, 1000.0)]
    assert asked == [100, 100, 200, 200, 300, 300]
