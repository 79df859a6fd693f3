"""Caps on a real GPU (`--with-gpu`): the NVML limiter against the machine's driver, in a
cgroup this test creates under /sys/fs/cgroup and removes. On a driver before r615 the
answer must be the one clean refusal (`driver-without-call`), never a crash; on r615+
the limits set must read back, and clearing must read back as no limit. The driver
version is printed either way (`-s` shows it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.agent.caps import gpu_capabilities, node_capability
from gpuslice.backends import memory_limiter_of, open_backend
from gpuslice.core.caps import CLEARED, MemoryLimits
from gpuslice.core.units import MIB
from gpuslice.ports import GpuBackend, MemoryLimitsError


@pytest.fixture
def nvml(request: pytest.FixtureRequest) -> Iterator[GpuBackend]:
    if not request.config.getoption("--with-gpu"):
        pytest.skip("needs --with-gpu")
    backend = open_backend("nvml")
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def cgroup() -> Iterator[Path]:
    root = Path("/sys/fs/cgroup")
    if not (root / "cgroup.controllers").is_file() or os.geteuid() != 0:
        pytest.skip("needs cgroup v2 and root to create a cgroup")
    path = root / f"gpuslice-caps-check-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        path.rmdir()


def test_the_drivers_answer_is_a_cap_or_one_clean_refusal(nvml: GpuBackend, cgroup: Path) -> None:
    inv = nvml.inventory()
    limiter = memory_limiter_of(nvml)
    assert limiter is not None
    supported = limiter.memory_limits_supported()
    print(f"driver {inv.driver_version}: nvmlDeviceSetMemoryLimits_v1 present: {supported}")
    caps = gpu_capabilities(inv, limiter, node_capability(), "auto")
    gpu = next(g for g in inv.gpus if not g.mig_enabled)
    want = MemoryLimits(1024 * MIB, 2048 * MIB)
    if not supported:
        assert caps[gpu.uuid].refusal == "driver-without-call"
        with pytest.raises(MemoryLimitsError) as err:
            limiter.set_memory_limits(gpu.uuid, str(cgroup), want)
        assert err.value.refusal == "driver-without-call"
        return
    assert caps[gpu.uuid].capable
    limiter.set_memory_limits(gpu.uuid, str(cgroup), want)
    got = limiter.get_memory_limits(gpu.uuid, str(cgroup))
    print(f"read back: {got} (used {got.used_bytes})")
    assert got.same_limits(want)
    limiter.set_memory_limits(gpu.uuid, str(cgroup), CLEARED)
    assert limiter.get_memory_limits(gpu.uuid, str(cgroup)).cleared
