"""One face for two API servers, so a test can run against both: the double
(`testing.apiserver`) and a real kube-apiserver (`testing.envtest`).

Tests take either through the same few verbs (add a Node, label it, delete it, read its
Events, add and delete pods bound to it, restart the server); where the two disagree, a
test run against both says so. It lives here rather than in a test directory's
`conftest.py` so that test modules import it by its package name: two `conftest` modules
on `sys.path` (another test directory in the same pytest run) made `from conftest import`
pick the wrong one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuslice.core.jsontypes import Json
from gpuslice.k8s.pods import NodePods
from gpuslice.testing import envtest
from gpuslice.testing.apiserver import FakeApiServer


@dataclass
class RealKube:
    """A real kube-apiserver, shared by many tests: names get the test's `prefix` so that
    no two tests touch the same object."""

    plane: envtest.ControlPlane
    prefix: str

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def name(self, base: str) -> str:
        """A name no other test on the shared server uses."""
        return f"{base}-{self.prefix}"

    def _ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.plane.kubectl(*args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Json:
        node: Json = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        if labels:
            node["metadata"]["labels"] = labels
        created = self._ok(
            "create", "--validate=false", "-o", "json", "-f", "-", stdin=json.dumps(node)
        )
        return dict(json.loads(created))

    def set_node_label(self, node: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one label, as `kubectl label` does."""
        self._ok(
            "label", "node", node, f"{key}-" if value is None else f"{key}={value}", "--overwrite"
        )

    def set_node_annotation(self, node: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation, as `kubectl annotate` does."""
        self._ok(
            "annotate", "node", node, f"{key}-" if value is None else f"{key}={value}",
            "--overwrite",
        )  # fmt: skip

    def delete_node(self, name: str) -> None:
        self._ok("delete", "node", name, "--wait=false")

    def node(self, name: str) -> Json:
        return dict(json.loads(self._ok("get", "node", name, "-o", "json")))

    def events(self, namespace: str) -> list[Json]:
        listed = json.loads(self._ok("get", "events", "-n", namespace, "-o", "json"))
        return list(listed["items"])

    def namespace(self, name: str) -> None:
        done = self.plane.kubectl("create", "namespace", name)
        assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr

    def restart(self) -> None:
        """Restart kube-apiserver (a plane of the test's own: the shared one must not be)."""
        self.plane.restart_apiserver()

    def add_pod(self, namespace: str, name: str, node: str, containers: Mapping[str, str]) -> str:
        """A pod bound to `node` (its `nodeName` set, as the scheduler's binding leaves it),
        with the container statuses a kubelet would write (`set_pod_containers`); its UID,
        which the server chooses. Creates the namespace and its `default` ServiceAccount
        (nothing else does without a controller-manager; admission wants it)."""
        self.namespace(namespace)
        account = {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": namespace}}  # fmt: skip
        done = self.plane.kubectl(
            "create", "--validate=false", "-f", "-", stdin=json.dumps(account)
        )
        assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [{"name": c, "image": "cuda:test"} for c in containers],
            },
        }
        created = self._ok(
            "create", "--validate=false", "-o", "json", "-f", "-", stdin=json.dumps(pod)
        )
        self.set_pod_containers(namespace, name, containers)
        return str(json.loads(created)["metadata"]["uid"])

    def set_pod_containers(self, namespace: str, name: str, containers: Mapping[str, str]) -> None:
        """Write the pod's container statuses as a kubelet does (the status subresource):
        each container's `containerID`, "" for one not started yet."""
        statuses = [_container_status(c, ident) for c, ident in containers.items()]
        status = {"status": {"phase": "Running", "containerStatuses": statuses}}
        self._ok("patch", "pod", name, "-n", namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps(status))  # fmt: skip

    def delete_pod(self, namespace: str, name: str) -> None:
        """Deleted at once (`--grace-period=0 --force`): without a kubelet to confirm, a
        graceful delete only sets `deletionTimestamp` and the pod stays."""
        self._ok("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force")


class DoubleKube:
    """The API server double; every test has its own, so names are used as given."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.kubeconfig = api.kubeconfig()

    def name(self, base: str) -> str:
        return base

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Json:
        return self.api.add_node(name, labels or {})

    def set_node_label(self, node: str, key: str, value: str | None) -> None:
        self.api.set_node_label(node, key, value)

    def set_node_annotation(self, node: str, key: str, value: str | None) -> None:
        self.api.set_node_annotation(node, key, value)

    def delete_node(self, name: str) -> None:
        self.api.delete_node(name)

    def node(self, name: str) -> Json:
        return self.api.node(name)

    def events(self, namespace: str) -> list[Json]:
        return self.api.events(namespace)

    def namespace(self, name: str) -> None:
        """The double has no namespace objects: every name exists."""

    def restart(self) -> None:
        """What a restarted kube-apiserver does to its clients: open watches are cut, and
        its new watch cache holds no history, so a watch from an older resourceVersion is
        410 Gone."""
        self.api.compact()
        self.api.break_watches()

    def add_pod(self, namespace: str, name: str, node: str, containers: Mapping[str, str]) -> str:
        return str(self.api.add_pod(namespace, name, None, node, containers)["metadata"]["uid"])

    def set_pod_containers(self, namespace: str, name: str, containers: Mapping[str, str]) -> None:
        self.api.set_pod_containers(namespace, name, containers)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.api.delete_pod(namespace, name)


def _container_status(name: str, ident: str) -> Json:
    """A container status as the kubelet writes it: running with its ID, or waiting."""
    status: Json = {"name": name, "image": "cuda:test", "imageID": "", "restartCount": 0}
    if not ident:
        return {**status, "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
    scheme = "" if "://" in ident else "containerd://"
    return {**status, "ready": True, "started": True, "state": {"running": {}},
            "containerID": scheme + ident}  # fmt: skip


Kube = RealKube | DoubleKube


@asynccontextmanager
async def running_pods(pods: NodePods) -> AsyncIterator[NodePods]:
    """`pods.run` for the duration of the block, stopped (within 10 s) after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(pods.run(stop))
    try:
        yield pods
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task


async def pods_until(pods: NodePods, predicate: Callable[[], bool], within_s: float) -> None:
    """Wait, at most `within_s`, until the pod cache satisfies `predicate` (re-checked at
    each change of the cache)."""
    async with asyncio.timeout(within_s):
        while True:
            pods.changed.clear()
            if predicate():
                return
            await pods.changed.wait()
