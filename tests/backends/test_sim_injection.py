"""Injecting faults, processes and load into the simulated backend, from threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.core.health import HealthEvent
from gpuslice.core.units import MIB
from gpuslice.ports import BackendError, GpuProcess


@pytest.fixture
def sim() -> Iterator[SimulatedBackend]:
    backend = open_backend("sim:2xt4,1xa100-40gb/mig=3g.20gb*2", environ={})
    assert isinstance(backend, SimulatedBackend)
    try:
        yield backend
    finally:
        backend.close()


def test_xid_is_delivered_once(sim: SimulatedBackend) -> None:
    gpu = sim.inventory().gpus[1]
    sim.inject_xid(gpu.uuid, 79)
    assert sim.wait_health_event(1.0) == HealthEvent("xid", gpu.uuid, xid=79)
    assert sim.wait_health_event(0.05) is None


def test_events_keep_their_order(sim: SimulatedBackend) -> None:
    a, b, _ = sim.inventory().gpus
    sim.inject_xid(a.uuid, 48)
    sim.inject_lost(b.uuid)
    sim.inject_recovery(a.uuid)
    got = [sim.wait_health_event(1.0) for _ in range(3)]
    assert got == [
        HealthEvent("xid", a.uuid, xid=48),
        HealthEvent("lost", b.uuid),
        HealthEvent("recovered", a.uuid),
    ]


def test_mig_attributed_xid(sim: SimulatedBackend) -> None:
    gpu = sim.inventory().gpus[2]
    gi = gpu.mig_devices[1].gi_id
    sim.inject_xid(gpu.uuid, 94, gi_id=gi, ci_id=0)
    assert sim.wait_health_event(1.0) == HealthEvent("xid", gpu.uuid, xid=94, gi_id=gi, ci_id=0)


def test_bad_injections_are_refused(sim: SimulatedBackend) -> None:
    gpus = sim.inventory().gpus
    with pytest.raises(BackendError, match=r"no GPU 'GPU-nope' on this simulated node"):
        sim.inject_xid("GPU-nope", 79)
    with pytest.raises(BackendError, match=r"has no GPU instance 5; its GI ids: 1, 2"):
        sim.inject_xid(gpus[2].uuid, 79, gi_id=5)
    with pytest.raises(BackendError, match=r"no GPU instance 1; its GI ids: none \(MIG off\)"):
        sim.inject_xid(gpus[0].uuid, 79, gi_id=1)


def test_waiter_in_another_thread_gets_the_event(sim: SimulatedBackend) -> None:
    gpu = sim.inventory().gpus[0]
    got: list[HealthEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(sim.wait_health_event(30.0)))
    waiter.start()
    sim.inject_xid(gpu.uuid, 63)
    waiter.join(timeout=10.0)
    assert not waiter.is_alive()
    assert got == [HealthEvent("xid", gpu.uuid, xid=63)]


def test_close_wakes_a_waiter() -> None:
    backend = open_backend("sim:1xt4", environ={})
    got: list[HealthEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(backend.wait_health_event(30.0)))
    waiter.start()
    backend.close()
    waiter.join(timeout=10.0)
    assert not waiter.is_alive()
    assert got == [None]


def test_each_event_goes_to_exactly_one_of_many_waiters(sim: SimulatedBackend) -> None:
    gpu = sim.inventory().gpus[0]
    got: list[HealthEvent | None] = []
    lock = threading.Lock()

    def wait() -> None:
        event = sim.wait_health_event(0.5)
        with lock:
            got.append(event)

    waiters = [threading.Thread(target=wait) for _ in range(4)]
    for w in waiters:
        w.start()
    for xid in (31, 43):
        sim.inject_xid(gpu.uuid, xid)
    for w in waiters:
        w.join(timeout=10.0)
    events = sorted((e.xid for e in got if e is not None), key=lambda x: x or 0)
    assert events == [31, 43]
    assert got.count(None) == 2


def test_processes_and_memory(sim: SimulatedBackend) -> None:
    t4 = sim.inventory().gpus[0]
    sim.add_process(GpuProcess(10, t4.uuid, 1000 * MIB, sm_util_percent=20))
    sim.add_process(GpuProcess(11, t4.uuid, 500 * MIB + 1, is_mps_client=True))
    sim.add_process(GpuProcess(12, t4.uuid, None))
    status = {s.gpu_uuid: s for s in sim.statuses()}[t4.uuid]
    assert status.memory_used_mib == 1501  # partial MiB rounds up, unknown counts as 0
    assert status.memory_free_mib == 15360 - 1501
    assert {p.pid: p.is_mps_client for p in sim.processes()} == {10: False, 11: True, 12: False}
    sim.add_process(GpuProcess(10, t4.uuid, 3000 * MIB))  # same pid, same GPU: replaced
    sim.remove_process(11)
    procs = sim.processes()
    assert sorted(p.pid for p in procs) == [10, 12]
    assert next(p for p in procs if p.pid == 10).used_memory_bytes == 3000 * MIB


def test_mig_processes_need_their_mig_device(sim: SimulatedBackend) -> None:
    a100 = sim.inventory().gpus[2]
    mig = a100.mig_devices[0]
    with pytest.raises(BackendError, match=r"is in MIG mode; name the MIG device"):
        sim.add_process(GpuProcess(20, a100.uuid, MIB))
    with pytest.raises(BackendError, match=r"no per-process SM utilisation on MIG"):
        sim.add_process(GpuProcess(20, a100.uuid, MIB, mig_uuid=mig.uuid, sm_util_percent=5))
    with pytest.raises(BackendError, match=r"has no MIG device MIG-x"):
        sim.add_process(GpuProcess(20, a100.uuid, MIB, mig_uuid="MIG-x"))
    sim.add_process(GpuProcess(20, a100.uuid, 4096 * MIB, mig_uuid=mig.uuid))
    (proc,) = sim.processes()
    assert proc.mig_uuid == mig.uuid
    assert {s.gpu_uuid: s.memory_used_mib for s in sim.statuses()}[a100.uuid] == 4096


def test_set_status_and_last_xid(sim: SimulatedBackend) -> None:
    gpu = sim.inventory().gpus[1]
    sim.set_status(gpu.uuid, gpu_util_percent=85, temperature_c=71, power_w=61.5)
    sim.set_status(gpu.uuid, memory_util_percent=40)
    sim.inject_xid(gpu.uuid, 79)
    status = {s.gpu_uuid: s for s in sim.statuses()}[gpu.uuid]
    assert (status.gpu_util_percent, status.memory_util_percent) == (85, 40)
    assert (status.temperature_c, status.power_w, status.last_xid) == (71, 61.5, 79)
    with pytest.raises(BackendError, match=r"gpu_util_percent: expected 0..100, got 101"):
        sim.set_status(gpu.uuid, gpu_util_percent=101)
