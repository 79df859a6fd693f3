"""A real node (kubelet + containerd, `testing.realnode`) on a real control plane
(`testing.envtest`, with a kube-controller-manager: ResourceClaimTemplates become claims,
Deployments pods, namespaces get their `default` ServiceAccount), shared by the tests here;
they skip, saying why, where this machine cannot run one (no binaries, not root, a Debian
package missing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuslice.testing import envtest, realnode


@pytest.fixture(scope="session")
def node_plane() -> Iterator[envtest.ControlPlane]:
    try:
        realnode.requirements()
    except realnode.RealNodeUnavailable as exc:
        pytest.skip(f"no real node: {exc}")
    with envtest.running(controller_manager=True) as plane:
        yield plane


@pytest.fixture(scope="session")
def real_node(node_plane: envtest.ControlPlane) -> Iterator[realnode.RealNode]:
    with realnode.running(node_plane, "real-node-1") as node:
        yield node
