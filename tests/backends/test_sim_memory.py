"""Simulated GPU memory: processes grow over time and die of OOM when the GPU is full."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.backends.simulated import ControlDir, SimulatedBackend
from gpuslice.backends.simulated.memory import Allocation, GpuMemoryModel
from gpuslice.backends.simulated.nodespec import parse_spec
from gpuslice.core.units import MIB
from gpuslice.ports import BackendError


def test_the_late_starter_dies_not_the_process_that_filled_the_card() -> None:
    gpu = GpuMemoryModel(1000, step_s=0.1)
    assert gpu.start(1, Allocation(start_mib=300), 0.0) is None
    assert gpu.start(2, Allocation(rate_mib_s=100), 0.0) is None  # leaks 100 MiB/s
    gpu.advance(5.0)
    assert (gpu.usage(1), gpu.usage(2)) == (300, 500)
    death = gpu.start(3, Allocation(start_mib=300), 5.0)  # seed 001: the last to start
    assert death is not None
    assert (death.pid, death.wanted_mib, death.free_mib) == (3, 300, 200)
    assert gpu.usage(3) is None
    assert gpu.usage(2) == 500


def test_a_leaker_alone_dies_when_it_meets_the_end_of_the_card() -> None:
    gpu = GpuMemoryModel(1000, step_s=0.1)
    gpu.start(1, Allocation(start_mib=300), 0.0)
    gpu.start(2, Allocation(rate_mib_s=100), 0.0)
    died = gpu.advance(10.0)
    assert [d.pid for d in died] == [2]
    assert died[0].at == pytest.approx(7.1)
    assert gpu.free_mib == 700


def test_growth_stops_at_the_target_and_memory_is_freed_on_exit() -> None:
    gpu = GpuMemoryModel(1000)
    gpu.start(1, Allocation(start_mib=100, rate_mib_s=50, target_mib=400), 0.0)
    gpu.advance(100.0)
    assert gpu.usage(1) == 400
    gpu.stop(1)
    assert gpu.free_mib == 1000


def test_bursts_come_and_go() -> None:
    a = Allocation(start_mib=100, burst_mib=200, burst_every_s=10, burst_s=2)
    assert [a.wanted_mib(t) for t in (0, 5, 10, 11, 12.5, 20.5)] == [100, 100, 300, 300, 100, 300]
    gpu = GpuMemoryModel(250, step_s=0.5)
    gpu.start(1, a, 0.0)
    died = gpu.advance(11.0)
    assert [(d.pid, d.wanted_mib) for d in died] == [(1, 300)]


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"rate_mib_s": -1}, "rate_mib_s"), ({"start_mib": 10, "target_mib": 5}, "target_mib")],
)
def test_bad_allocations_name_the_field(kw: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Allocation(**kw)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_backend_grows_processes_and_reports_oom_deaths(tmp_path: Path) -> None:
    clock = Clock()
    sim = SimulatedBackend(parse_spec("1xt4"), control_dir=tmp_path / "ctl", clock=clock)
    try:
        total = sim.inventory().gpus[0].memory_mib  # 15360
        ctl = ControlDir(tmp_path / "ctl")
        ctl.add_process(10, 0, used_memory_mib=5000)  # a fixed process counts too
        ctl.grow_process(11, 0, start_mib=1000, rate_mib_s=1000)
        ctl.grow_process(12, 0, start_mib=2000, target_mib=2000)
        assert {p.pid: p.used_memory_bytes for p in sim.processes()} == {
            10: 5000 * MIB,
            11: 1000 * MIB,
            12: 2000 * MIB,
        }
        clock.t = 3.0
        [status] = sim.statuses()
        assert status.memory_used_mib == 5000 + 4000 + 2000
        assert status.memory_free_mib == total - 11000
        clock.t = 10.0
        pids = {p.pid for p in sim.processes()}
        assert pids == {10, 12}, "the leaker met the end of the card"
        [(uuid, death)] = sim.oom_deaths()
        assert death.pid == 11
        assert uuid == status.gpu_uuid
        assert ctl.rejected() == []
        ctl.send({"kind": "grow_process", "pid": 13, "gpu": 0, "rateMiBPerS": -5})
        sim.processes()
        assert len(ctl.rejected()) == 1
    finally:
        sim.close()


def test_no_growing_memory_on_mig(tmp_path: Path) -> None:
    sim = SimulatedBackend(parse_spec("1xa30/mig=2g.12gb*2"))
    try:
        with pytest.raises(BackendError, match="MIG"):
            sim.start_growing(1, sim.inventory().gpus[0].uuid, Allocation(start_mib=1))
    finally:
        sim.close()
