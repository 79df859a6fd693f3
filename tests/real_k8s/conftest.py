"""The Kubernetes API both ways: the double (`testing.apiserver`) and a real kube-apiserver
(`testing.envtest`, from `KUBEBUILDER_ASSETS`). Tests that take `kube` run against both, so
where the two disagree a test says so; the real server is started once per test run, and a
test that must restart it gets one of its own (`restartable_kube`).

The helpers tests import live in `gpuslice.testing.kubes`, not here: a conftest holds
fixtures only, and nothing imports it by name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from lightkube import AsyncClient

from gpuslice.k8s import make_client
from gpuslice.testing import envtest
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.kubes import DoubleKube, Kube, RealKube


@pytest.fixture(scope="session")
def control_plane() -> Iterator[envtest.ControlPlane]:
    try:
        with envtest.running() as plane:
            yield plane
    except envtest.EnvtestUnavailable as exc:
        pytest.skip(f"no real API server: {exc}")


@pytest.fixture(scope="session")
def own_control_plane() -> Iterator[envtest.ControlPlane]:
    """A second control plane (no scheduler) for the tests that restart its API server,
    so the shared one is never disturbed."""
    try:
        with envtest.running(scheduler=False) as plane:
            yield plane
    except envtest.EnvtestUnavailable as exc:
        pytest.skip(f"no real API server: {exc}")


_COUNTER = iter(range(1_000_000))


@pytest.fixture(params=["double", "real"])
def kube(request: pytest.FixtureRequest) -> Iterator[Kube]:
    """Either server; node names get a unique suffix on the shared real one."""
    if request.param == "double":
        with running_apiserver() as api:
            yield DoubleKube(api)
    else:
        plane: envtest.ControlPlane = request.getfixturevalue("control_plane")
        yield RealKube(plane, f"t{next(_COUNTER)}")


@pytest.fixture(params=["double", "real"])
def restartable_kube(request: pytest.FixtureRequest) -> Iterator[Kube]:
    """Either server, the real one of the restarting tests only, so `restart()` disturbs
    no other test."""
    if request.param == "double":
        with running_apiserver() as api:
            yield DoubleKube(api)
    else:
        plane: envtest.ControlPlane = request.getfixturevalue("own_control_plane")
        yield RealKube(plane, f"r{next(_COUNTER)}")


@pytest.fixture
async def client(kube: Kube) -> AsyncIterator[AsyncClient]:
    c = make_client(kube.kubeconfig, trust_env=False)
    try:
        yield c
    finally:
        await c.close()
