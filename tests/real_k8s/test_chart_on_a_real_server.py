"""The chart rendered by Helm and applied to a real kube-apiserver: its RBAC and admission
policies accepted, and the agent's identity (its service account, impersonated with the node
name its bound token carries) can do what the agent does and is refused a step beyond."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.testing import envtest

sys.path.insert(0, str(Path(__file__).parents[1] / "chart"))

NODE_EXTRA = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def installed(control_plane: envtest.ControlPlane) -> dict[str, str]:
    from test_chart import render  # the chart tests' Helm rendering (skips without Helm)

    result = render(labels={"mode": "api"}, dra={"enabled": True})
    assert result.ok, result.problems
    manifests: list[dict[str, Any]] = list(result.manifests)
    [account] = [m for m in manifests if m["kind"] == "ServiceAccount"]
    namespace, name = account["metadata"]["namespace"], account["metadata"]["name"]
    control_plane.kubectl("create", "namespace", namespace)
    applied = control_plane.kubectl(
        "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(manifests)
    )
    assert applied.returncode == 0, applied.stderr
    node = "gpu-chart-1"
    created = control_plane.kubectl(
        "create", "--validate=false", "-f", "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node, "labels": {"nvidia.com/device-plugin.config": "a100"}}}),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    # the API server loads a new admission policy asynchronously: wait until it refuses
    # (a server-side dry run, so nothing changes while it does not yet)
    deadline = time.monotonic() + 30
    while not as_agent(
        control_plane,
        {"user": f"system:serviceaccount:{namespace}:{name}", "node": node},
        "label", "node", node, "team=probe", "--dry-run=server",
    ):  # fmt: skip
        assert time.monotonic() < deadline, "the node-patch policy was never enforced"
        time.sleep(0.2)
    return {
        "namespace": namespace,
        "user": f"system:serviceaccount:{namespace}:{name}",
        "node": node,
    }


def as_agent(plane: envtest.ControlPlane, who: dict[str, str], *args: str, node: str = "") -> str:
    """kubectl as the agent on `node` (its own by default); stderr when refused, else ''."""
    done = plane.kubectl(*args, as_user=who["user"], extra=[(NODE_EXTRA, node or who["node"])])
    return "" if done.returncode == 0 else done.stderr


def test_the_agent_applies_its_nvidia_labels_on_its_own_node(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    node = installed["node"]
    for labels in ({"nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu.count": "2"}):
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}
        done = control_plane.kubectl(
            "apply", "--server-side", "--field-manager=gpuslice", "--force-conflicts",
            "--validate=false", "-f", "-", stdin=json.dumps(body),
            as_user=installed["user"], extra=[(NODE_EXTRA, node)],
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    got = json.loads(control_plane.kubectl("get", "node", node, "-o", "json").stdout)
    labels = got["metadata"]["labels"]
    assert labels["nvidia.com/gpu.count"] == "2"
    assert "nvidia.com/gpu.replicas" not in labels, "retracted by its field manager"
    assert labels["nvidia.com/device-plugin.config"] == "a100", "others' labels untouched"


@pytest.mark.parametrize(
    ("args", "refused_by"),
    [
        (["label", "node", "{node}", "team=x"], "only nvidia.com/ labels"),
        (["annotate", "node", "{node}", "team=x"], "not its annotations, ownerReferences"),
        (
            [
                "patch",
                "node",
                "{node}",
                "--type",
                "merge",
                "-p",
                '{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap",'
                '"name":"gone","uid":"00000000-0000-0000-0000-000000000001"}]}}',
            ],
            "not its annotations, ownerReferences",
        ),
        (
            [
                "patch",
                "node",
                "{node}",
                "--type",
                "merge",
                "-p",
                '{"metadata":{"finalizers":["example.com/x"]}}',
            ],
            "not its annotations, ownerReferences",
        ),
        (["taint", "node", "{node}", "a=b:NoSchedule"], "may not change the Node's spec"),
        (["get", "secrets", "-n", "kube-system"], 'cannot list resource "secrets"'),
        (["delete", "node", "{node}", "--dry-run=server"], 'cannot delete resource "nodes"'),
    ],
)
def test_a_step_beyond_is_refused(
    control_plane: envtest.ControlPlane,
    installed: dict[str, str],
    args: list[str],
    refused_by: str,
) -> None:
    refusal = as_agent(
        control_plane, installed, *[a.replace("{node}", installed["node"]) for a in args]
    )
    assert refused_by in refusal, refusal


def test_another_nodes_labels_are_refused(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    args = ["label", "node", installed["node"], "nvidia.com/x=1"]
    refusal = as_agent(control_plane, installed, *args, node="some-other-node")
    assert "only the Node it runs on" in refusal, refusal


def test_events_only_in_the_agents_namespace(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    def event(namespace: str) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "agent.", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": "agent",
                               "namespace": namespace},
            "reason": "ConfigApplied", "message": "x", "type": "Normal",
        })  # fmt: skip

    def create(namespace: str) -> str:
        done = control_plane.kubectl(
            "create", "--validate=false", "-f", "-", stdin=event(namespace),
            as_user=installed["user"], extra=[(NODE_EXTRA, installed["node"])],
        )  # fmt: skip
        return "" if done.returncode == 0 else done.stderr

    assert create(installed["namespace"]) == ""
    assert 'cannot create resource "events"' in create("kube-system")
