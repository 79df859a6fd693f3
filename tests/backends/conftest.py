"""Backends under test: simulated always; NVML only with `--with-gpu` (see tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuslice.backends import open_backend
from gpuslice.ports import GpuBackend

SIM_NODES = (
    "sim:2xt4",
    "sim:1xt4,1xl40s,1xrtx-3060",
    "sim:8xh100-80gb",
    "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2,1xa100-40gb",
    "sim:2xa100-80gb/mig=1g.10gb*7",
    "sim:1xa30/mig=2g.12gb+1g.6gb*2",
    "sim:1xh200/mig=all-1g.18gb",
    "sim:1xgb10",  # unified memory: NVML reports no memory figure
)


@pytest.fixture(params=[*SIM_NODES, "nvml"])
def backend(request: pytest.FixtureRequest) -> Iterator[GpuBackend]:
    spec: str = request.param
    if spec == "nvml" and not request.config.getoption("--with-gpu"):
        pytest.skip("NVML contract needs --with-gpu")
    opened = open_backend(spec)
    try:
        yield opened
    finally:
        opened.close()
