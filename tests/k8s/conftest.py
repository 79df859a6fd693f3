"""The API server double and a real lightkube client pointed at it over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from lightkube import AsyncClient

from gpuslice.k8s import make_client
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[AsyncClient]:
    c = make_client(api.kubeconfig(), trust_env=False)
    try:
        yield c
    finally:
        await c.close()
