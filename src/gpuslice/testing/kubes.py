"""One face for two API servers, so a test can run against both: the double
(`testing.apiserver`) and a real kube-apiserver (`testing.envtest`).

Tests take either through the same few verbs (add a Node, label it, delete it, read its
Events, restart the server); where the two disagree, a test run against both says so. It
lives here rather than in a test directory's `conftest.py` so that test modules import it
by its package name: two `conftest` modules on `sys.path` (another test directory in the
same pytest run) made `from conftest import ...` pick the wrong one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.testing import envtest
from gpuslice.testing.apiserver import FakeApiServer

Json = dict[str, Any]


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


Kube = RealKube | DoubleKube
