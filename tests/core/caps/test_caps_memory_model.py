"""The simulator's reading of NVML's per-cgroup memory limits (`core.gpumemory`)."""

from __future__ import annotations

import pytest

from gpuslice.core.gpumemory import Allocation, GpuMemoryModel


def test_past_the_hard_limit_only_that_process_fails() -> None:
    m = GpuMemoryModel(1000, step_s=1.0)
    m.set_limits("/cg/a", 300, 300)
    m.set_limits("/cg/b", 300, 300)
    assert m.start(1, Allocation(start_mib=100, rate_mib_s=100), 0.0, group="/cg/a") is None
    assert m.start(2, Allocation(start_mib=100, rate_mib_s=10), 0.0, group="/cg/b") is None
    died = m.advance(5.0)
    assert [(d.pid, d.reason) for d in died] == [(1, "hard-limit")]
    assert died[0].free_mib > 0  # it failed with memory free: its own cap, not the card
    assert m.usage(2) == 150


def test_the_hard_limit_counts_every_process_of_the_cgroup() -> None:
    m = GpuMemoryModel(1000, step_s=1.0)
    m.set_limits("/cg/a", 0, 250)
    assert m.start(1, Allocation(start_mib=200), 0.0, group="/cg/a") is None
    death = m.start(2, Allocation(start_mib=100), 0.0, group="/cg/a")
    assert death is not None
    assert death.reason == "hard-limit"


def test_the_soft_limit_is_held_back_from_others() -> None:
    m = GpuMemoryModel(1000, step_s=1.0)
    m.set_limits("/cg/small", 400, 400)
    m.set_limits("/cg/leak", 0, None)  # borrow: no hard limit of its own
    m.start(1, Allocation(start_mib=0), 0.0, group="/cg/leak")
    m.start(2, Allocation(start_mib=50, rate_mib_s=50, target_mib=400), 0.0, group="/cg/small")
    m.start(3, Allocation(start_mib=0, rate_mib_s=200), 0.0, group="/cg/leak")
    died = m.advance(10.0)
    # the leak stops where the small cgroup's unused guarantee begins: 1000 - 400 = 600
    assert [(d.pid, d.reason) for d in died] == [(3, "out-of-memory")]
    assert m.usage(2) == 400


def test_without_limits_the_newcomer_dies_as_cuda_does() -> None:
    m = GpuMemoryModel(1000, step_s=1.0)
    m.start(1, Allocation(start_mib=0, rate_mib_s=200), 0.0)
    m.start(2, Allocation(start_mib=50, rate_mib_s=50, target_mib=400), 0.0)
    died = m.advance(10.0)
    assert 2 in {d.pid for d in died}


def test_a_late_cgroup_cannot_take_back_what_a_borrower_already_holds() -> None:
    """The documented limit of the model: a guarantee set after the memory is gone."""
    m = GpuMemoryModel(1000, step_s=1.0)
    m.start(1, Allocation(start_mib=900), 0.0, group="/cg/leak")
    m.set_limits("/cg/late", 300, 300)
    death = m.start(2, Allocation(start_mib=200), 1.0, group="/cg/late")
    assert death is not None
    assert death.reason == "out-of-memory"


def test_clearing_lifts_both_limits() -> None:
    m = GpuMemoryModel(1000, step_s=1.0)
    m.set_limits("/cg/a", 100, 100)
    m.set_limits("/cg/a", 0, None)
    assert m.limits == {}
    assert m.start(1, Allocation(start_mib=500), 0.0, group="/cg/a") is None
    m.set_limits("/cg/b", 100, 100)
    m.clear_limits("/cg/b")
    assert m.start(2, Allocation(start_mib=400), 0.0, group="/cg/b") is None


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        GpuMemoryModel(1000).set_limits("/cg/a", -1, None)
