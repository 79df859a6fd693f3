"""The two `MemoryLimiter`s: the simulator's, and NVML's through the real nvidia-ml-py
binding (its structs and its function lookup) over a stand-in library object, since no
GPU is here: a driver without the function, MIG, errors, clearing, reading back."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from gpuslice.backends.nvml_limits import NvmlMemoryLimiter
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.backends.simulated.memory import Allocation
from gpuslice.backends.simulated.nodespec import parse_spec
from gpuslice.core.caps import CLEARED, LIMIT_MAX, MemoryLimits
from gpuslice.core.units import MIB
from gpuslice.ports import MemoryLimiter, MemoryLimitsError

CG = "/sys/fs/cgroup/kubepods.slice/kubepods-pod0.slice/cri-containerd-a.scope"


def sim(spec: str, driver: str = "615.20") -> SimulatedBackend:
    node = dataclasses.replace(parse_spec(spec.removeprefix("sim:")), driver_version=driver)
    return SimulatedBackend(node, clock=lambda: 0.0)


def test_simulated_limits_set_read_back_and_clear() -> None:
    b = sim("sim:1xl40s")
    limiter: MemoryLimiter = b
    uuid = b.inventory().gpus[0].uuid
    assert limiter.memory_limits_supported()
    assert limiter.get_memory_limits(uuid, CG) == MemoryLimits(0, LIMIT_MAX, used_bytes=0)
    limiter.set_memory_limits(uuid, CG, MemoryLimits(4096 * MIB, 8192 * MIB))
    b.start_growing(7, uuid, Allocation(start_mib=1000), cgroup=CG)
    got = limiter.get_memory_limits(uuid, CG)
    assert got == MemoryLimits(4096 * MIB, 8192 * MIB, used_bytes=1000 * MIB)
    limiter.set_memory_limits(uuid, CG, CLEARED)
    assert limiter.get_memory_limits(uuid, CG).cleared


def test_simulated_hard_limit_fails_the_process_alone() -> None:
    now = [0.0]
    node = dataclasses.replace(parse_spec("1xl40s"), driver_version="615.20")
    b = SimulatedBackend(node, clock=lambda: now[0])
    uuid = b.inventory().gpus[0].uuid
    b.set_memory_limits(uuid, CG, MemoryLimits(1000 * MIB, 1000 * MIB))
    b.start_growing(7, uuid, Allocation(start_mib=500, rate_mib_s=100), cgroup=CG)
    b.start_growing(8, uuid, Allocation(start_mib=500, rate_mib_s=100))
    now[0] = 10.0
    deaths = b.oom_deaths()
    assert [(d.pid, d.reason) for _, d in deaths] == [(7, "hard-limit")]
    assert {p.pid for p in b.processes()} == {8}


def test_removing_the_cgroup_clears_its_limits() -> None:
    b = sim("sim:1xl40s")
    uuid = b.inventory().gpus[0].uuid
    b.set_memory_limits(uuid, CG, MemoryLimits(MIB, MIB))
    b.remove_cgroup(CG)
    assert b.get_memory_limits(uuid, CG).cleared


def test_simulated_old_driver_has_no_call() -> None:
    b = sim("sim:1xl40s", driver="580.95.05")
    uuid = b.inventory().gpus[0].uuid
    assert not b.memory_limits_supported()
    with pytest.raises(MemoryLimitsError) as err:
        b.set_memory_limits(uuid, CG, MemoryLimits(MIB, MIB))
    assert err.value.refusal == "driver-without-call"


def test_simulated_mig_gpu_is_refused() -> None:
    b = sim("sim:1xa100-40gb/mig=3g.20gb*2")
    with pytest.raises(MemoryLimitsError) as err:
        b.set_memory_limits(b.inventory().gpus[0].uuid, CG, MemoryLimits(MIB, MIB))
    assert err.value.refusal == "mig"


def test_simulated_errors_and_gone_cgroups() -> None:
    node = dataclasses.replace(parse_spec("2xt4"), driver_version="615.20")
    b = SimulatedBackend(node, cgroup_exists=lambda p: p == CG)
    a, c = (g.uuid for g in b.inventory().gpus)
    b.fail_memory_limits(a, "Unknown Error")
    with pytest.raises(MemoryLimitsError) as err:
        b.set_memory_limits(a, CG, MemoryLimits(MIB, MIB))
    assert err.value.refusal == "nvml-error"
    b.set_memory_limits(c, CG, MemoryLimits(MIB, MIB))  # the other GPU still answers
    b.fail_memory_limits(a, None)
    b.set_memory_limits(a, CG, MemoryLimits(MIB, MIB))
    with pytest.raises(MemoryLimitsError) as gone:
        b.get_memory_limits(a, CG + "-gone")
    assert gone.value.refusal == "gone"


# -- NVML, through the real binding ---------------------------------------------------


class FakeLib:
    """Stands in for libnvidia-ml: pynvml looks each function up on it by name, as with
    the real library; a driver before r615 simply has no attribute of that name."""

    def __init__(self, *, has_limits: bool = True, error: int = 0) -> None:
        self.limits: dict[str, tuple[int, int]] = {}
        self.error = error
        if has_limits:
            self.nvmlDeviceSetMemoryLimits_v1 = self._set
            self.nvmlDeviceGetMemoryLimits_v1 = self._get

    def _set(self, device: Any, ref: Any) -> int:
        s = ref._obj
        if self.error:
            return self.error
        self.limits[s.nameSpace] = (s.softLimit, s.hardLimit)
        return 0

    def _get(self, device: Any, ref: Any) -> int:
        s = ref._obj
        if self.error:
            return self.error
        s.softLimit, s.hardLimit = self.limits.get(s.nameSpace, (0, LIMIT_MAX))
        s.currentUsed = 123 * MIB
        return 0


@pytest.fixture
def fake_lib() -> Iterator[Any]:
    saved = pynvml.nvmlLib
    pynvml._nvmlGetFunctionPointer_cache.clear()

    def install(lib: FakeLib) -> FakeLib:
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml.nvmlLib = lib
        return lib

    try:
        yield install
    finally:
        pynvml.nvmlLib = saved
        pynvml._nvmlGetFunctionPointer_cache.clear()


def limiter(mig: bool = False) -> NvmlMemoryLimiter:
    return NvmlMemoryLimiter(pynvml, lambda uuid: (ctypes.c_void_p(1), mig))


def test_nvml_set_and_get_go_through_the_binding(fake_lib: Any) -> None:
    lib = fake_lib(FakeLib())
    lim = limiter()
    lim.set_memory_limits("GPU-a", CG, MemoryLimits(4096 * MIB, 8192 * MIB))
    assert lib.limits == {CG: (4096 * MIB, 8192 * MIB)}
    assert lim.get_memory_limits("GPU-a", CG) == MemoryLimits(
        4096 * MIB, 8192 * MIB, used_bytes=123 * MIB
    )
    lim.set_memory_limits("GPU-a", CG, CLEARED)
    assert lib.limits[CG] == (0, pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)


def test_nvml_old_driver_is_driver_without_call(fake_lib: Any) -> None:
    fake_lib(FakeLib(has_limits=False))
    with pytest.raises(MemoryLimitsError) as err:
        limiter().set_memory_limits("GPU-a", CG, MemoryLimits(MIB, MIB))
    assert err.value.refusal == "driver-without-call"


def test_nvml_errors_are_named(fake_lib: Any) -> None:
    fake_lib(FakeLib(error=pynvml.NVML_ERROR_NO_PERMISSION))
    with pytest.raises(MemoryLimitsError) as err:
        limiter().set_memory_limits("GPU-a", CG, MemoryLimits(MIB, MIB))
    assert err.value.refusal == "nvml-error"
    assert "GPU-a" in str(err.value)
    fake_lib(FakeLib(error=pynvml.NVML_ERROR_NOT_FOUND))
    with pytest.raises(MemoryLimitsError) as gone:
        limiter().get_memory_limits("GPU-a", CG)
    assert gone.value.refusal == "gone"


def test_nvml_mig_refused_before_asking(fake_lib: Any) -> None:
    lib = fake_lib(FakeLib())
    with pytest.raises(MemoryLimitsError) as err:
        limiter(mig=True).set_memory_limits("GPU-a", CG, MemoryLimits(MIB, MIB))
    assert err.value.refusal == "mig"
    assert lib.limits == {}
