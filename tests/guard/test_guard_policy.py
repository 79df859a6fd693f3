"""The guard policy: borrowing, reclaim order, reserve, grace, hysteresis, strict, exemptions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.guard import (
    ContainerKey,
    Evaluation,
    GpuMemory,
    GuardParams,
    GuardState,
    Reserve,
    Tenant,
    evaluate,
)
from gpuslice.core.sharing.model import SharingStrategy

GIB = 1024**3
TOTAL = 48 * GIB  # an L40S
SHARE = TOTAL // 4  # four time-slicing replicas


def key(pod: str) -> ContainerKey:
    return ContainerKey("default", pod, "main")


def tenant(
    pod: str,
    used_gib: float,
    *,
    gpu: str = "GPU-0",
    share: int = SHARE,
    kind: SharingStrategy = SharingStrategy.TIME_SLICING,
) -> Tenant:
    return Tenant(key(pod), gpu, kind, share, int(used_gib * GIB), (hash(pod) % 30000 + 100,))


def gpu(used: int, uuid: str = "GPU-0", total: int = TOTAL) -> GpuMemory:
    return GpuMemory(uuid, 0, total, total - used)


def enforce(**kw: object) -> GuardParams:
    base: dict[str, object] = {"mode": "enforce", "reserve": Reserve(bytes=4 * GIB), "grace_s": 0}
    base.update(kw)
    return GuardParams(**base)  # type: ignore[arg-type]


def run(
    tenants: list[Tenant], params: GuardParams, now: float = 0.0, state: GuardState | None = None
) -> Evaluation:
    used = sum(t.used_bytes for t in tenants if t.gpu_uuid == "GPU-0")
    gpus = [gpu(used)]
    if any(t.gpu_uuid == "GPU-1" for t in tenants):
        gpus.append(gpu(sum(t.used_bytes for t in tenants if t.gpu_uuid == "GPU-1"), "GPU-1"))
    return evaluate(gpus, tenants, state or GuardState(), params, now)


def reclaimed(ev) -> list[str]:  # type: ignore[no-untyped-def]
    return [d.key.pod for d in ev.decisions if d.kind == "reclaim"]


def test_borrowing_allowed_while_free_memory_above_reserve() -> None:
    ev = run([tenant("a", 30), tenant("b", 5)], enforce())  # 13 GiB free > 4 GiB reserve
    assert reclaimed(ev) == []
    assert [d.kind for d in ev.decisions] == ["over-share"]
    assert ev.over_share == {(key("a"), "GPU-0")}


def test_below_reserve_the_overrunning_pod_is_reclaimed_not_the_last_comer() -> None:
    ev = run([tenant("leaker", 30), tenant("b", 10), tenant("late", 6)], enforce())
    assert reclaimed(ev) == ["leaker"]
    d = next(d for d in ev.decisions if d.kind == "reclaim")
    assert (d.used_bytes, d.share_bytes, d.free_bytes, d.reserve_bytes) == (
        30 * GIB,
        SHARE,
        2 * GIB,
        4 * GIB,
    )
    assert d.enforced
    assert d.reason == "memory-pressure"


def test_largest_overrun_first_and_only_as_many_as_needed() -> None:
    # 46 GiB used, 2 GiB free: freeing the largest (18 GiB, overrun 6) restores the reserve.
    ev = run([tenant("big", 18), tenant("mid", 16), tenant("c", 12)], enforce())
    assert reclaimed(ev) == ["big"]


def test_several_victims_when_one_does_not_restore_the_reserve() -> None:
    # 47 GiB used; overruns: x 1 GiB (13), y 0.5 GiB (12.5); pods under share fill the rest.
    ev = run(
        [tenant("x", 13), tenant("y", 12.5), tenant("ok1", 11.5), tenant("ok2", 10)],
        enforce(reserve=Reserve(bytes=20 * GIB)),
    )
    assert reclaimed(ev) == ["x", "y"]


def test_pods_within_share_are_never_victims_even_when_reserve_cannot_be_restored() -> None:
    ev = run([tenant("a", 12), tenant("b", 12), tenant("c", 12), tenant("d", 11)], enforce())
    assert reclaimed(ev) == []


def test_observe_mode_reports_without_enforcing_or_remembering() -> None:
    ev = run([tenant("leaker", 30), tenant("b", 16)], enforce(mode="observe"))
    [d] = [d for d in ev.decisions if d.kind == "reclaim"]
    assert not d.enforced
    assert ev.state.stopping == {}


def test_observe_mode_reports_a_would_be_victim_once_while_it_stays_one() -> None:
    params = enforce(mode="observe")
    pods = [tenant("leaker", 30), tenant("b", 16)]
    ev = run(pods, params, now=0)
    assert reclaimed(ev) == ["leaker"]
    ev = run(pods, params, now=1, state=ev.state)
    assert reclaimed(ev) == []
    ev = run([tenant("leaker", 20), tenant("b", 16)], params, now=2, state=ev.state)
    ev = run(pods, params, now=3, state=ev.state)
    assert reclaimed(ev) == ["leaker"]


def test_off_mode_decides_nothing() -> None:
    ev = run([tenant("leaker", 30), tenant("b", 16)], enforce(mode="off"))
    assert ev.decisions == ()
    assert ev.over_share == frozenset()


def test_grace_filters_a_short_spike() -> None:
    params = enforce(grace_s=2.0)
    spike = [tenant("a", 30), tenant("b", 16)]
    ev = run(spike, params, now=0.0)
    assert reclaimed(ev) == []
    ev = run([tenant("a", 20), tenant("b", 16)], params, now=1.0, state=ev.state)  # 12 free
    assert reclaimed(ev) == []
    assert ev.state.pressure_since == {}
    ev = run(spike, params, now=2.0, state=ev.state)  # a new spike restarts the clock
    assert reclaimed(ev) == []
    ev = run(spike, params, now=4.0, state=ev.state)  # lasted the grace
    assert reclaimed(ev) == ["a"]


def test_a_deep_dip_skips_the_grace() -> None:
    params = enforce(grace_s=5.0)  # critical below 2 GiB free
    ev = run([tenant("a", 30), tenant("b", 15)], params, now=0.0)  # 3 GiB free: wait
    assert reclaimed(ev) == []
    ev = run([tenant("a", 31.5), tenant("b", 15)], params, now=1.0, state=ev.state)
    assert reclaimed(ev) == ["a"]  # 1.5 GiB free: no waiting


def test_hysteresis_keeps_the_pressure_clock_while_free_memory_hovers_at_the_reserve() -> None:
    params = enforce(grace_s=2.0)  # release at 5 GiB free
    ev = run([tenant("a", 30), tenant("b", 15)], params, now=0.0)  # 3 GiB free
    ev = run([tenant("a", 29.5), tenant("b", 14)], params, now=1.0, state=ev.state)  # 4.5 free
    assert ev.state.pressure_since == {"GPU-0": 0.0}
    ev = run([tenant("a", 30), tenant("b", 15)], params, now=2.0, state=ev.state)
    assert reclaimed(ev) == ["a"]


def test_stopping_pod_counts_as_freed_then_is_escalated_after_grace() -> None:
    params = enforce(grace_s=1.0)
    pods = [tenant("a", 30), tenant("b", 15)]
    ev = run(pods, params, now=0.0)
    ev = run(pods, params, now=1.0, state=ev.state)
    assert reclaimed(ev) == ["a"]
    ev = run(pods, params, now=1.5, state=ev.state)  # still exiting: no second victim
    assert ev.decisions == ()
    ev = run(pods, params, now=2.0, state=ev.state)
    assert [(d.kind, d.key.pod) for d in ev.decisions] == [("escalate", "a")]
    ev = run(pods, params, now=5.0, state=ev.state)
    assert ev.decisions == ()  # escalated once
    gone = [tenant("a", 0), tenant("b", 15)]
    gone[0] = Tenant(key("a"), "GPU-0", SharingStrategy.TIME_SLICING, SHARE, 0, ())
    ev = run(gone, params, now=6.0, state=ev.state)
    assert ev.state.stopping == {}
    assert ev.state.escalated == frozenset()


def test_strict_stops_any_overrun_whatever_the_free_memory() -> None:
    params = enforce(strict=True, grace_s=1.0)
    pods = [tenant("a", 13), tenant("b", 2)]
    ev = run(pods, params, now=0.0)
    assert reclaimed(ev) == []
    ev = run(pods, params, now=1.0, state=ev.state)
    assert reclaimed(ev) == ["a"]
    assert ev.decisions[-1].reason == "strict"


def test_an_mps_share_over_its_share_is_reclaimed_and_mig_exclusive_are_exempt() -> None:
    """An MPS client that unset its limit (the share daemon's default is the largest share
    on the GPU), or a container running several, is over its share: the server did not
    hold it, the guard does."""
    ev = run(
        [
            tenant("mps", 30, kind=SharingStrategy.MPS),
            tenant("mig", 12, kind=SharingStrategy.MIG, share=6 * GIB),
            tenant("excl", 5, kind=SharingStrategy.NONE, share=TOTAL),
        ],
        enforce(),
    )
    assert reclaimed(ev) == ["mps"]
    assert [(d.kind, d.key.pod, d.enforced) for d in ev.decisions] == [
        ("over-share", "mps", False),
        ("reclaim", "mps", True),
    ]


def test_multi_gpu_pod_is_one_victim_and_its_memory_counts_on_every_gpu() -> None:
    # "wide" overruns on both GPUs; both are under pressure; it is chosen once, and its
    # memory on GPU-1 restores that GPU's reserve, so "other" there is spared.
    tenants = [
        tenant("wide", 20),
        tenant("b", 12),
        tenant("c", 12),
        tenant("wide", 16, gpu="GPU-1"),
        tenant("other", 13, gpu="GPU-1"),
        tenant("d", 12, gpu="GPU-1"),
        tenant("e", 5, gpu="GPU-1"),
    ]
    ev = run(tenants, enforce())
    assert reclaimed(ev) == ["wide"]
    assert ev.over_share == {
        (key("wide"), "GPU-0"),
        (key("wide"), "GPU-1"),
        (key("other"), "GPU-1"),
    }


def test_over_share_notice_once_per_crossing() -> None:
    params = enforce(mode="observe")
    ev = run([tenant("a", 13)], params, now=0)
    assert [d.kind for d in ev.decisions] == ["over-share"]
    ev = run([tenant("a", 14)], params, now=1, state=ev.state)
    assert ev.decisions == ()
    ev = run([tenant("a", 5)], params, now=2, state=ev.state)
    ev = run([tenant("a", 13)], params, now=3, state=ev.state)
    assert [d.kind for d in ev.decisions] == ["over-share"]


def test_reserve_as_fraction_of_the_gpu() -> None:
    assert Reserve(fraction=0.1).of(TOTAL) == int(TOTAL * 0.1)
    assert Reserve(bytes=8 * GIB, fraction=0.1).of(TOTAL) == 8 * GIB


usage = st.lists(
    st.tuples(
        st.integers(0, 30 * GIB),
        st.sampled_from(
            [
                SharingStrategy.TIME_SLICING,
                SharingStrategy.TIME_SLICING,
                SharingStrategy.MPS,
                SharingStrategy.MIG,
                SharingStrategy.NONE,
            ]
        ),
        st.sampled_from(["GPU-0", "GPU-1"]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(
    usage,
    st.integers(0, 20 * GIB),
    st.booleans(),
    st.integers(0, 12 * GIB),
)
def test_invariants(rows, reserve, strict, free_other) -> None:  # type: ignore[no-untyped-def]
    tenants = [
        Tenant(key(f"p{i}"), g, kind, SHARE, used, (1000 + i,))
        for i, (used, kind, g) in enumerate(rows)
    ]
    gpus = []
    for uuid in ("GPU-0", "GPU-1"):
        used = sum(t.used_bytes for t in tenants if t.gpu_uuid == uuid)
        gpus.append(GpuMemory(uuid, 0, used + free_other, free_other))
    params = GuardParams(mode="enforce", reserve=Reserve(bytes=reserve), grace_s=0, strict=strict)
    ev = evaluate(gpus, tenants, GuardState(), params, 0.0)
    by_pair = {(t.key, t.gpu_uuid): t for t in tenants}
    victims = [d for d in ev.decisions if d.kind == "reclaim"]
    for d in victims:
        t = by_pair[(d.key, d.gpu_uuid)]
        assert t.used_bytes > t.share_bytes  # within its share: never a victim
        assert t.kind in ("time-slicing", "mps")  # MIG/exclusive exempt
    assert len({d.key for d in victims}) == len(victims)  # each container stopped once
    if not strict:
        for d in victims:  # only under pressure, and only as many as needed
            g = next(g for g in gpus if g.uuid == d.gpu_uuid)
            assert g.free_bytes < reserve
        for g in gpus:
            mine = [d for d in victims if d.gpu_uuid == g.uuid]
            freed_before_last = sum(
                t.used_bytes
                for t in tenants
                if t.gpu_uuid == g.uuid
                and t.key in {d.key for d in victims}
                and t.key != (mine[-1].key if mine else None)
            )
            if mine:
                assert g.free_bytes + freed_before_last < reserve
            over = sorted((by_pair[(d.key, g.uuid)].overrun_bytes for d in mine), reverse=True)
            assert over == [by_pair[(d.key, g.uuid)].overrun_bytes for d in mine]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 20), min_size=3, max_size=3), min_size=1, max_size=12),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.booleans(),
    st.sampled_from(["observe", "enforce"]),
)
def test_over_any_sequence_of_polls_only_overrunning_pods_are_victims(
    polls: list[list[int]], grace: float, strict: bool, mode: str
) -> None:
    params = GuardParams(
        mode=mode,  # type: ignore[arg-type]
        reserve=Reserve(bytes=4 * GIB),
        grace_s=grace,
        strict=strict,
    )
    state = GuardState()
    before: dict[ContainerKey, int] = {}
    for step, usage in enumerate(polls):
        tenants = [tenant(f"p{i}", used) for i, used in enumerate(usage)]
        ev = run(tenants, params, now=float(step), state=state)
        state = ev.state
        by_key = {t.key: t for t in tenants}
        # borrowing growth over the 1 s step: containers over their share that grew
        fall = sum(
            t.used_bytes - before[t.key]
            for t in tenants
            if t.overrun_bytes > 0 and t.key in before and t.used_bytes > before[t.key]
        )
        for d in ev.decisions:
            if d.kind == "reclaim":
                assert by_key[d.key].used_bytes > by_key[d.key].share_bytes
                # without strict, only while free memory is below the reserve or borrowing
                # grows fast enough to take it there within the grace plus the lookahead
                horizon = params.grace_s + params.lookahead_s
                assert strict or d.free_bytes - fall * horizon < 4 * GIB
        before = {t.key: t.used_bytes for t in tenants}


def test_a_leak_projected_below_the_reserve_is_reclaimed_a_poll_early() -> None:
    """Free memory 12 GiB, falling 8 GiB per 1 s poll: still above the 4 GiB reserve now,
    below it before the next poll. Without the projection the leaker is seen a poll late."""
    params = enforce(lookahead_s=1.25)
    first = run([tenant("leaker", 20), tenant("b", 8)], params, now=0.0)  # 20 GiB free
    assert reclaimed(first) == []
    ev = run([tenant("leaker", 28), tenant("b", 8)], params, now=1.0, state=first.state)
    assert reclaimed(ev) == ["leaker"]
    d = next(d for d in ev.decisions if d.kind == "reclaim")
    assert (d.free_bytes, d.borrowing_growth_bytes_per_s) == (12 * GIB, 8 * GIB)

    no_projection = enforce(lookahead_s=0)
    first = run([tenant("leaker", 20), tenant("b", 8)], no_projection, now=0.0)
    late = run([tenant("leaker", 28), tenant("b", 8)], no_projection, now=1.0, state=first.state)
    assert reclaimed(late) == []


def test_a_burst_that_stops_is_not_reclaimed_once_it_holds_still() -> None:
    """A borrower jumps 8 GiB in one poll (projected below the reserve: the grace clock
    starts), then holds still with free memory above the reserve: nobody is reclaimed."""
    params = enforce(grace_s=1.0, lookahead_s=1.25)
    t0 = run([tenant("burst", 20), tenant("b", 8)], params, now=0.0)
    t1 = run([tenant("burst", 28), tenant("b", 8)], params, now=1.0, state=t0.state)
    assert reclaimed(t1) == []  # grace not over
    assert "GPU-0" in t1.state.pressure_since
    t2 = run([tenant("burst", 28), tenant("b", 8)], params, now=2.0, state=t1.state)
    assert reclaimed(t2) == []  # grace over, but 12 GiB free and not falling


def test_rising_free_memory_projects_nothing() -> None:
    params = enforce(lookahead_s=10.0)
    t0 = run([tenant("a", 30), tenant("b", 10)], params, now=0.0)  # 8 GiB free
    t1 = run([tenant("a", 25), tenant("b", 10)], params, now=1.0, state=t0.state)
    assert reclaimed(t1) == []
    assert t1.state.last_used[(key("a"), "GPU-0")] == (1.0, 25 * GIB)


def test_a_pod_growing_within_its_share_does_not_make_a_stable_borrower_a_victim_early() -> None:
    """b loads a model within its share (1 -> 11 GiB of a 12 GiB share) while a borrows a
    steady 25 GiB: free memory falls 10 GiB in a poll, which projected would cross the
    reserve, but only borrowing is projected, so nobody is reclaimed while 12 GiB are free."""
    params = enforce(lookahead_s=1.25)
    t0 = run([tenant("a", 25), tenant("b", 1)], params, now=0.0)  # 22 GiB free
    t1 = run([tenant("a", 25), tenant("b", 11)], params, now=1.0, state=t0.state)  # 12 free
    assert reclaimed(t1) == []
    assert "GPU-0" not in t1.state.pressure_since
