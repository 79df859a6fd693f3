"""Least privilege in the rendered chart, and the node-patch policy's CEL run with celpy."""

from __future__ import annotations

import functools
from typing import Any

import celpy
import pytest

from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import one, render


def _agent_user() -> str:
    account = one(render(labels={"mode": "api"}), "ServiceAccount")["metadata"]
    return f"system:serviceaccount:{account['namespace']}:{account['name']}"


SA = _agent_user()
NODE_EXTRA = "authentication.kubernetes.io/node-name"


def container_context(**values: Any) -> Json:
    ds = one(render(**values), "DaemonSet")
    [container] = ds["spec"]["template"]["spec"]["containers"]
    return dict(container["securityContext"])


def test_default_is_unprivileged_with_no_capabilities_and_read_only_root() -> None:
    ctx = container_context()
    assert ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["readOnlyRootFilesystem"] is True
    ds = one(render(), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}} in pod["volumes"]
    [container] = pod["containers"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_mps_asks_for_privilege_and_an_explicit_context_wins() -> None:
    mps = container_context(mps={"enabled": True})
    assert mps["privileged"] is True
    assert mps["runAsUser"] == 0, "the image's default user is not root"
    assert container_context(securityContext={"runAsUser": 7}) == {"runAsUser": 7}


def test_only_a_guard_that_kills_gets_cap_kill() -> None:
    enforce_kill = container_context(memoryGuard={"mode": "enforce", "action": "kill"})
    assert enforce_kill["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert enforce_kill["privileged"] is False
    for guard in ({"mode": "enforce", "action": "evict"}, {"mode": "observe"}):
        assert container_context(memoryGuard=guard)["capabilities"] == {"drop": ["ALL"]}


def policy(**values: Any) -> Json:
    return one(render(labels={"mode": "api"}, **values), "ValidatingAdmissionPolicy")


@functools.cache
def node_policy() -> Json:
    """The node-patch policy as labels.mode=api renders it (rendered once: Helm is slow)."""
    return policy()


def test_policy_only_in_api_mode_and_bound() -> None:
    kinds = {m["kind"] for m in render().manifests}
    assert "ValidatingAdmissionPolicy" not in kinds
    result = render(labels={"mode": "api"})
    binding = one(result, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy()["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    off = render(labels={"mode": "api", "restrictNodePatch": False})
    assert "ValidatingAdmissionPolicy" not in {m["kind"] for m in off.manifests}


def node(name: str, labels: dict[str, str], spec: Json | None = None) -> Json:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec or {"podCIDR": "10.0.0.0/24"},
    }


def request(node_name: str | None, user: str = SA) -> Json:
    info: Json = {"username": user}
    if node_name is not None:
        info["extra"] = {NODE_EXTRA: [node_name]}
    return {"userInfo": info}


def _run(expression: str, activation: Json) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def evaluate(expression: str, activation: Json) -> bool:
    result = _run(expression, activation)
    assert isinstance(result, celpy.celtypes.BoolType), result
    return bool(result)


def verdicts(old: Json, new: Json, req: Json) -> list[bool] | None:
    """Each validation's verdict, the policy's variables evaluated first as the API server
    does; None when the request is not the agent's (the policy does not apply)."""
    spec = node_policy()["spec"]
    activation: Json = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(req),
    }
    [cond] = spec["matchConditions"]
    if not evaluate(cond["expression"], activation):
        return None
    variables: dict[Any, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(variable["name"])] = _run(
            variable["expression"], activation
        )
    activation["variables"] = celpy.celtypes.MapType(variables)
    return [evaluate(v["expression"], activation) for v in spec["validations"]]


def admitted(old: Json, new: Json, req: Json) -> bool:
    found = verdicts(old, new, req)
    return found is None or all(found)


BASE = {"kubernetes.io/hostname": "gpu-1", "nvidia.com/gpu.count": "8"}


@pytest.mark.parametrize(
    ("new", "req", "expected"),
    [
        # its own node, nvidia.com/ labels added, changed, removed
        (node("gpu-1", {**BASE, "nvidia.com/gpu.replicas": "4"}), request("gpu-1"), True),
        (node("gpu-1", {**BASE, "nvidia.com/gpu.count": "4"}), request("gpu-1"), True),
        (node("gpu-1", {"kubernetes.io/hostname": "gpu-1"}), request("gpu-1"), True),
        # another node
        (node("gpu-1", {**BASE, "nvidia.com/x": "1"}), request("gpu-2"), False),
        # no node in the token (not a bound pod token)
        (node("gpu-1", {**BASE, "nvidia.com/x": "1"}), request(None), False),
        # labels outside nvidia.com/: added, changed, removed
        (node("gpu-1", {**BASE, "team": "x"}), request("gpu-1"), False),
        (node("gpu-1", {**BASE, "kubernetes.io/hostname": "evil"}), request("gpu-1"), False),
        (node("gpu-1", {"nvidia.com/gpu.count": "8"}), request("gpu-1"), False),
        # spec (taints, unschedulable) untouched
        (
            node("gpu-1", BASE, {"podCIDR": "10.0.0.0/24", "unschedulable": True}),
            request("gpu-1"),
            False,
        ),
        # somebody else entirely: not this policy's business
        (node("gpu-1", {**BASE, "team": "x"}), request("gpu-2", user="kubernetes-admin"), True),
    ],
)
def test_node_patch_policy(new: Json, req: Json, expected: bool) -> None:
    assert admitted(node("gpu-1", BASE), new, req) is expected


def full_node(**metadata: Any) -> Json:
    """A Node as the API server stores it: server-set metadata, spec and status."""
    return {
        "metadata": {
            "name": "gpu-1",
            "uid": "3f0c5d0e-1111-4222-8333-444455556666",
            "resourceVersion": "100",
            "creationTimestamp": "2026-11-24T10:00:00Z",
            "labels": dict(BASE),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            **metadata,
        },
        "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "a", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "8"}},
    }


def with_labels(n: Json, labels: dict[str, str]) -> Json:
    return {**n, "metadata": {**n["metadata"], "labels": labels}}


OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0000-gone"}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # what the agent does: nvidia.com/ labels, with what the API server changes itself
        ({"labels": {**BASE, "nvidia.com/gpu.replicas": "4"}}, True),
        (
            {
                "labels": {**BASE, "nvidia.com/gpu.replicas": "4"},
                "resourceVersion": "101",
                "managedFields": [{"manager": "gpuslice", "operation": "Apply"}],
            },
            True,
        ),
        # metadata beyond the labels: refused
        ({"ownerReferences": [OWNER]}, False),
        ({"finalizers": ["example.com/never-delete"]}, False),
        ({"annotations": {"node.alpha.kubernetes.io/ttl": "0", "team": "x"}}, False),
        ({"annotations": {}}, False),
        ({"deletionGracePeriodSeconds": 0}, False),
        ({"uid": "6f6f6f6f-1111-4222-8333-444455556666"}, False),
        ({"generateName": "x-"}, False),
    ],
)
def test_the_node_keeps_all_its_metadata_but_nvidia_labels(change: Json, expected: bool) -> None:
    old = full_node()
    new = full_node(**change)
    assert admitted(old, new, request("gpu-1")) is expected


def test_the_node_keeps_its_status_and_taints() -> None:
    old = full_node()
    tainted = {**old, "spec": {**old["spec"], "taints": []}}
    assert not admitted(old, tainted, request("gpu-1"))
    status = {**old, "status": {"capacity": {"cpu": "9"}}}
    assert not admitted(old, status, request("gpu-1"))
    assert admitted(old, with_labels(old, {**BASE, "nvidia.com/x": "1"}), request("gpu-1"))


# -- managedFields ---------------------------------------------------------------------
# Entries as the real API server writes them (tests/real_k8s/test_chart_on_a_real_server.py
# runs the same requests against it).


def entry(manager: str, labels: list[str], *, op: str = "Update", time: str = "T1",
          more: Json | None = None) -> Json:  # fmt: skip
    fields: Json = {"f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}}}
    if more:
        fields.update(more)
    return {"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields,
            "manager": manager, "operation": op, "time": time}  # fmt: skip


CREATED = entry("kubectl-create", [".", "team", "nvidia.com/device-plugin.config"])
KUBELET = entry("kubelet", ["kubernetes.io/hostname"], more={"f:spec": {"f:podCIDR": {}}})
AGENT = entry("gpuslice", ["nvidia.com/gpu.count"], op="Apply", time="T2")


def owned(*entries: Json) -> Json:
    n = full_node()
    n["metadata"]["labels"] = {**BASE, "team": "a"}
    if entries:
        n["metadata"]["managedFields"] = list(entries)
    else:
        del n["metadata"]["managedFields"]
    return n


def managed_fields_verdict(old: list[Json], new: list[Json]) -> bool:
    """The managedFields rule's verdict alone (the labels stay as they are)."""
    spec = node_policy()["spec"]
    [index] = [i for i, v in enumerate(spec["validations"]) if "managedFields" in v["message"]]
    found = verdicts(owned(*old), owned(*new), request("gpu-1"))
    assert found is not None
    return found[index]


def _without(e: Json, label: str) -> Json:
    fields = {**e["fieldsV1"]["f:metadata"]["f:labels"]}
    del fields[f"f:{label}"]
    return {**e, "fieldsV1": {**e["fieldsV1"], "f:metadata": {"f:labels": fields}}}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # the agent's apply: its own entry comes, changes, empties ({"f:labels": {}})
        ([CREATED, KUBELET], [AGENT, CREATED, KUBELET], True),
        ([AGENT, CREATED, KUBELET], [{**AGENT, "time": "T3"}, CREATED, KUBELET], True),
        ([AGENT, CREATED], [entry("gpuslice", [], op="Apply"), CREATED], True),
        # a forced apply takes an nvidia.com/ label over from another writer
        (
            [CREATED, KUBELET],
            [
                entry("gpuslice", ["nvidia.com/device-plugin.config"], op="Apply"),
                _without(CREATED, "nvidia.com/device-plugin.config"),
                KUBELET,
            ],
            True,
        ),
        # the server stamps the entry a request wrote (kubectl label as the agent)
        (
            [CREATED, KUBELET],
            [
                CREATED,
                entry(
                    "kubelet",
                    ["kubernetes.io/hostname", "nvidia.com/x"],
                    time="T9",
                    more={"f:spec": {"f:podCIDR": {}}},
                ),
            ],
            True,
        ),
        # the first apply to a Node without managedFields
        ([], [AGENT, entry("before-first-apply", [".", "team"])], True),
        # reset ({"metadata": {"managedFields": [{}]}} leaves none)
        ([CREATED, KUBELET], [], False),
        ([CREATED, KUBELET], [AGENT], False),
        # an entry dropped, or one of its fields
        ([CREATED, KUBELET], [CREATED], False),
        ([CREATED, KUBELET], [_without(CREATED, "team"), KUBELET], False),
        ([CREATED, KUBELET], [_without(CREATED, "."), KUBELET], False),
        # co-owning another writer's label, or forging a writer
        ([CREATED], [entry("gpuslice", ["nvidia.com/x", "team"], op="Apply"), CREATED], False),
        ([CREATED], [CREATED, entry("kubelet", ["team"])], False),
        ([CREATED], [{**CREATED, "manager": "kubelet"}], False),
        ([CREATED], [{**CREATED, "operation": "Apply"}], False),
        ([CREATED], [CREATED, {**entry("x", []), "fieldsV1": {"f:spec": {"f:taints": {}}}}], False),
        # a time rewritten where nothing changed
        ([CREATED, KUBELET], [{**CREATED, "time": "T9"}, KUBELET], False),
        # a before-first-apply entry forged on a Node that has managedFields
        ([CREATED], [CREATED, entry("before-first-apply", ["team"])], False),
    ],
)
def test_managed_fields_change_only_for_nvidia_labels(
    old: list[Json], new: list[Json], expected: bool
) -> None:
    assert managed_fields_verdict(old, new) is expected


def test_events_are_written_in_the_agents_namespace_only() -> None:
    """A Role in the release namespace, and no cluster-wide right to events at all."""
    result = render()
    cluster_rules = [r for m in result.manifests if m["kind"] == "ClusterRole" for r in m["rules"]]
    assert not [r for r in cluster_rules if "events" in r.get("resources", [])]
    [role] = [
        m
        for m in result.manifests
        if m["kind"] == "Role" and m["metadata"]["name"].endswith("-events")
    ]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}
    ]
    [binding] = [m for m in result.manifests if m["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    [container] = one(result, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
