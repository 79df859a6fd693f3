"""The Kubernetes API both ways: the double (`testing.apiserver`) and a real kube-apiserver
(`testing.envtest`, from `KUBEBUILDER_ASSETS`). Tests that take `kube` run against both, so
where the two disagree a test says so; the real server is started once per test run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import AsyncClient

from gpuslice.k8s import make_client
from gpuslice.testing import envtest
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver

Json = dict[str, Any]


@pytest.fixture(scope="session")
def control_plane() -> Iterator[envtest.ControlPlane]:
    try:
        with envtest.running() as plane:
            yield plane
    except envtest.EnvtestUnavailable as exc:
        pytest.skip(f"no real API server: {exc}")


@dataclass
class RealKube:
    plane: envtest.ControlPlane
    prefix: str

    @property
    def kubeconfig(self) -> Any:
        return self.plane.kubeconfig

    def name(self, base: str) -> str:
        """A name no other test on the shared server uses."""
        return f"{base}-{self.prefix}"

    def _ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.plane.kubectl(*args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Json:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        if labels:
            node["metadata"]["labels"] = labels
        return dict(
            json.loads(
                self._ok(
                    "create", "--validate=false", "-o", "json", "-f", "-", stdin=json.dumps(node)
                )
            )
        )

    def node(self, name: str) -> Json:
        return dict(json.loads(self._ok("get", "node", name, "-o", "json")))

    def events(self, namespace: str) -> list[Json]:
        listed = json.loads(self._ok("get", "events", "-n", namespace, "-o", "json"))
        return list(listed["items"])

    def namespace(self, name: str) -> None:
        done = self.plane.kubectl("create", "namespace", name)
        assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr


class DoubleKube:
    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.kubeconfig = api.kubeconfig()

    def name(self, base: str) -> str:
        return base

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Json:
        return self.api.add_node(name, labels or {})

    def node(self, name: str) -> Json:
        return self.api.node(name)

    def events(self, namespace: str) -> list[Json]:
        return self.api.events(namespace)

    def namespace(self, name: str) -> None:
        """The double has no namespace objects: every name exists."""


_COUNTER = iter(range(1_000_000))


@pytest.fixture(params=["double", "real"])
def kube(request: pytest.FixtureRequest) -> Iterator[RealKube | DoubleKube]:
    """Either server; node names get a unique suffix on the shared real one."""
    if request.param == "double":
        with running_apiserver() as api:
            yield DoubleKube(api)
    else:
        plane: envtest.ControlPlane = request.getfixturevalue("control_plane")
        yield RealKube(plane, f"t{next(_COUNTER)}")


@pytest.fixture
async def client(kube: RealKube | DoubleKube) -> AsyncIterator[AsyncClient]:
    c = make_client(kube.kubeconfig, trust_env=False)
    try:
        yield c
    finally:
        await c.close()
