"""The chart rendered by Helm and applied to a real kube-apiserver: its RBAC and admission
policies accepted, and the agent's identity can do what the agent does and is refused a step
beyond. The identity is the real one where it matters: a token bound to a Pod on the node
(TokenRequest), which the API server gives the node's name as the extra
`authentication.kubernetes.io/node-name` that the chart's policies key on; the product's own
API code (labeler, watchers, Events, evictor, DRA objects) runs with it. Quick refusals use
kubectl impersonating the service account with that extra, as a bound token carries it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, AsyncClient

from gpuslice.core.jsontypes import Json
from gpuslice.k8s import (
    AgentPod,
    NodeEvents,
    NodeLabeler,
    NodeLabelWatcher,
    NodePods,
    PodEvictor,
    make_client,
)
from gpuslice.k8s.claimevents import ClaimEvents
from gpuslice.k8s.dra import DraApi
from gpuslice.testing import envtest

NODE_EXTRA = "authentication.kubernetes.io/node-name"
DRIVER = "gpu.nvidia.com"
OTHER_NODE = "gpu-chart-2"
REFUSED_OWNERS = "may not change who owns the Node's fields"


def _ok(plane: envtest.ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = plane.kubectl(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _create(plane: envtest.ControlPlane, obj: Json) -> Json:
    out = _ok(plane, "create", "--validate=false", "-o", "json", "-f", "-", stdin=json.dumps(obj))
    return dict(json.loads(out))


@pytest.fixture(scope="module")
def installed(
    control_plane: envtest.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    from tests.chart.chart_support import (
        render,  # the chart tests' Helm rendering (skips without Helm)
    )

    result = render(
        labels={"mode": "api"},
        dra={"enabled": True},
        memoryGuard={"mode": "enforce", "action": "evict"},
    )
    assert result.ok, result.problems
    manifests: list[Json] = list(result.manifests)
    [account] = [m for m in manifests if m["kind"] == "ServiceAccount"]
    namespace, name = account["metadata"]["namespace"], account["metadata"]["name"]
    control_plane.kubectl("create", "namespace", namespace)
    applied = control_plane.kubectl(
        "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(manifests)
    )
    assert applied.returncode == 0, applied.stderr
    node = "gpu-chart-1"
    labels = {"nvidia.com/device-plugin.config": "a100", "team": "a"}
    for n in (node, OTHER_NODE):
        _create(
            control_plane,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": labels}},
        )
    # The agent's Pod on the node, and a token bound to it, as the kubelet asks for one
    pod = _create(control_plane, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "agent", "namespace": namespace}, "spec": {
        "nodeName": node, "serviceAccountName": name, "automountServiceAccountToken": False,
        "containers": [{"name": "agent", "image": "gpuslice:test"}]}})  # fmt: skip
    token = _ok(
        control_plane, "create", "token", name, "-n", namespace, "--duration=1h",
        "--bound-object-kind=Pod", "--bound-object-name=agent",
    ).strip()  # fmt: skip
    kubeconfig = tmp_path_factory.mktemp("agent") / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "envtest", "cluster": {
            "server": control_plane.url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": "envtest", "user": "agent"}}],
    }))  # fmt: skip
    who = {"user": f"system:serviceaccount:{namespace}:{name}", "node": node}
    # the API server loads a new admission policy asynchronously: wait until both refuse
    # (server-side dry runs, so nothing changes while they do not yet)
    probe_slice = json.dumps(a_slice("probe", OTHER_NODE, DRIVER))
    deadline = time.monotonic() + 30
    while not (
        as_agent(control_plane, who, "label", "node", node, "team=probe", "--dry-run=server")
        and as_agent(control_plane, who, "create", "--validate=false", "--dry-run=server",
                     "-f", "-", stdin=probe_slice)
    ):  # fmt: skip
        assert time.monotonic() < deadline, "the admission policies were never enforced"
        time.sleep(0.2)
    return {
        "namespace": namespace,
        "account": name,
        "user": who["user"],
        "node": node,
        "pod_uid": pod["metadata"]["uid"],
        "kubeconfig": str(kubeconfig),
    }


def as_agent(
    plane: envtest.ControlPlane,
    who: dict[str, str],
    *args: str,
    node: str = "",
    stdin: str | None = None,
) -> str:
    """kubectl as the agent on `node` (its own by default); stderr when refused, else ''."""
    done = plane.kubectl(
        *args, as_user=who["user"], extra=[(NODE_EXTRA, node or who["node"])], stdin=stdin
    )
    return "" if done.returncode == 0 else done.stderr


def a_slice(name: str, node: str, driver: str) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node, "devices": [],
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip


@pytest.fixture
async def agent(installed: dict[str, str]) -> AsyncIterator[AsyncClient]:
    """The product's API client with the agent's bound token."""
    client = make_client(Path(installed["kubeconfig"]), trust_env=False)
    try:
        yield client
    finally:
        await client.close()


def node_meta(plane: envtest.ControlPlane, node: str) -> Json:
    got = json.loads(_ok(plane, "get", "node", node, "-o", "json", "--show-managed-fields"))
    return dict(got["metadata"])


def owners_but_agent(meta: Json) -> list[Json]:
    return [e for e in meta.get("managedFields", []) if e["manager"] != "gpuslice"]


def test_the_bound_token_carries_the_agents_node(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    """What both policies key on is there in a real token (Kubernetes >= 1.30)."""
    done = control_plane.kubectl(
        "--kubeconfig", installed["kubeconfig"], "auth", "whoami", "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    user = json.loads(done.stdout)["status"]["userInfo"]
    assert user["username"] == installed["user"]
    assert user["extra"][NODE_EXTRA] == [installed["node"]]


async def test_the_labeler_applies_and_retracts_with_the_agents_token(
    control_plane: envtest.ControlPlane, installed: dict[str, str], agent: AsyncClient
) -> None:
    node = installed["node"]
    before = owners_but_agent(node_meta(control_plane, node))
    labeler = NodeLabeler(agent, node)
    await labeler.apply({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2"})
    await labeler.apply({"nvidia.com/gpu.count": "2"})
    meta = node_meta(control_plane, node)
    assert meta["labels"]["nvidia.com/gpu.count"] == "2"
    assert "nvidia.com/gpu.replicas" not in meta["labels"], "retracted by its field manager"
    assert meta["labels"]["nvidia.com/device-plugin.config"] == "a100", "others' labels kept"
    assert owners_but_agent(meta) == before, "and who owns them"
    # taking an nvidia.com/ label over from the admin who set it moves only that label
    await labeler.apply({"nvidia.com/gpu.count": "2", "nvidia.com/device-plugin.config": "b"})
    await labeler.clear()
    meta = node_meta(control_plane, node)
    assert not [k for k in meta["labels"] if k.startswith("nvidia.com/")]
    assert meta["labels"]["team"] == "a"


async def test_the_first_apply_to_a_node_without_managed_fields(
    control_plane: envtest.ControlPlane, installed: dict[str, str], agent: AsyncClient
) -> None:
    """The API server then writes a `before-first-apply` entry owning what was there: the
    policy lets that one entry through."""
    node = installed["node"]
    _ok(control_plane, "patch", "node", node, "--type=merge",
        "-p", '{"metadata":{"managedFields":[{}]}}')  # fmt: skip
    assert "managedFields" not in node_meta(control_plane, node)
    await NodeLabeler(agent, node).apply({"nvidia.com/gpu.count": "1"})
    managers = {e["manager"] for e in node_meta(control_plane, node)["managedFields"]}
    assert managers == {"gpuslice", "before-first-apply"}
    await NodeLabeler(agent, node).clear()


FORGED = {
    "apiVersion": "v1",
    "fieldsType": "FieldsV1",
    "manager": "kubectl-label",
    "operation": "Update",
    "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}},
}


@pytest.mark.parametrize(
    "args",
    [
        # reset: the API server drops every entry
        ["patch", "node", "{node}", "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}'],
        ["patch", "node", "{node}", "--type=merge",
         "-p", '{"metadata":{"labels":{"nvidia.com/x":"1"},"managedFields":[{}]}}'],
        # forging an owner of another writer's label
        ["patch", "node", "{node}", "--type=json",
         "-p", json.dumps([{"op": "add", "path": "/metadata/managedFields/-", "value": FORGED}])],
        # co-owning it by applying its value unchanged
        ["apply", "--server-side", "--field-manager=gpuslice", "--force-conflicts",
         "--validate=false", "-f", "-"],
    ],
    ids=["reset", "reset-with-a-label", "forged-owner", "co-owned-label"],
)  # fmt: skip
def test_managed_fields_are_not_the_agents_to_change(
    control_plane: envtest.ControlPlane, installed: dict[str, str], args: list[str]
) -> None:
    node = installed["node"]
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {"nvidia.com/gpu.count": "1", "team": "a"}}}  # fmt: skip
    done = control_plane.kubectl(
        "--kubeconfig", installed["kubeconfig"], "--dry-run=server",
        *[a.replace("{node}", node) for a in args], stdin=json.dumps(body),
    )  # fmt: skip
    assert done.returncode != 0, "accepted"
    assert REFUSED_OWNERS in done.stderr, done.stderr


def test_the_kubelet_and_admins_are_not_the_policys_business(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    """The policy matches the agent's service account only: an admin and a kubelet (its
    node's identity, with the built-in system:node role) still reset managedFields and
    change any label."""
    node = installed["node"]
    _ok(control_plane, "create", "clusterrolebinding", "gpuslice-test-kubelet",
        "--clusterrole=system:node", f"--user=system:node:{node}")  # fmt: skip
    reset = ["patch", "node", node, "--type=merge", "--dry-run=server",
             "-p", '{"metadata":{"managedFields":[{}],"labels":{"team":"b"}}}']  # fmt: skip
    _ok(control_plane, *reset)
    kubelet = control_plane.kubectl(*reset, as_user=f"system:node:{node}")
    assert kubelet.returncode == 0, kubelet.stderr


@pytest.mark.parametrize(
    ("args", "refused_by"),
    [
        (["label", "node", "{node}", "team=x", "--overwrite"], "only nvidia.com/ labels"),
        (["label", "node", "{node}", "team-"], "only nvidia.com/ labels"),
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
        (["label", "node", OTHER_NODE, "nvidia.com/x=1"], "only the Node it runs on"),
        (["get", "secrets", "-n", "kube-system"], 'cannot list resource "secrets"'),
        (["get", "secret", "x", "-n", "kube-system"], 'cannot get resource "secrets"'),
        (["delete", "node", "{node}", "--dry-run=server"], 'cannot delete resource "nodes"'),
        (["get", "pod", "agent", "-n", "gpuslice"], 'cannot get resource "pods"'),
        (["get", "deviceclasses"], 'cannot list resource "deviceclasses"'),
        (
            [
                "patch",
                "node",
                "{node}",
                "--subresource=status",
                "--type=merge",
                "-p",
                '{"status":{"capacity":{"cpu":"1"}}}',
            ],
            'resource "nodes/status"',
        ),
    ],
)
def test_a_step_beyond_is_refused(
    control_plane: envtest.ControlPlane,
    installed: dict[str, str],
    args: list[str],
    refused_by: str,
) -> None:
    refusal = as_agent(
        control_plane,
        installed,
        "--dry-run=server" if args[0] in ("label", "annotate", "patch", "taint") else "-v=0",
        *[a.replace("{node}", installed["node"]) for a in args],
    )
    assert refused_by in refusal, refusal


def test_another_nodes_labels_are_refused(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    args = ["label", "node", installed["node"], "nvidia.com/x=1"]
    refusal = as_agent(control_plane, installed, *args, node="some-other-node")
    assert "only the Node it runs on" in refusal, refusal


async def test_the_driver_writes_its_own_nodes_slices_and_no_others(
    control_plane: envtest.ControlPlane, installed: dict[str, str], agent: AsyncClient
) -> None:
    node = installed["node"]
    dra = DraApi(agent, node, DRIVER)
    mine = await dra.create_slice(a_slice("", node, DRIVER) | {"metadata": {
        "generateName": f"{node}-"}})  # fmt: skip
    assert [s["metadata"]["name"] for s in await dra.list_slices()] == [mine["metadata"]["name"]]
    mine["spec"]["pool"]["generation"] = 2
    await dra.replace_slice(mine)
    await dra.delete_slice(mine["metadata"]["name"])
    assert await dra.list_slices() == []

    async def refused(write: Any) -> str:
        with pytest.raises(ApiError) as caught:
            await write
        assert caught.value.status.code == 403
        return str(caught.value.status.message)

    assert "only ResourceSlices of the Node it runs on" in await refused(
        dra.create_slice(a_slice("gpu-chart-2-theirs", OTHER_NODE, DRIVER))
    )
    assert f"only ResourceSlices of driver {DRIVER}" in await refused(
        dra.create_slice(a_slice("gpu-chart-1-other-driver", node, "other.example.com"))
    )
    theirs = _create(control_plane, a_slice("gpu-chart-2-admins", OTHER_NODE, DRIVER))
    theirs["spec"]["pool"]["generation"] = 2
    assert "of the Node it runs on" in await refused(dra.replace_slice(theirs))
    assert "of the Node it runs on" in await refused(dra.delete_slice("gpu-chart-2-admins"))
    _ok(control_plane, "delete", "resourceslice", "gpu-chart-2-admins")


async def test_what_the_agent_needs_it_can_do_with_its_token(
    control_plane: envtest.ControlPlane, installed: dict[str, str], agent: AsyncClient
) -> None:
    """Each code path of docs/install.md's "API access" table the agent runs, with the
    agent's own token (the slice writes and the labeler have their tests above)."""
    node, namespace = installed["node"], installed["namespace"]
    # nodes list + watch: the config label now, then its change through the watch
    key = "nvidia.com/device-plugin.config"
    _ok(control_plane, "label", "node", node, f"{key}=a100", "--overwrite")
    watcher = NodeLabelWatcher(agent, node, key)
    values = watcher.values()
    assert await asyncio.wait_for(anext(values), 5) == "a100"
    _ok(control_plane, "label", "node", node, f"{key}=h100", "--overwrite")
    assert await asyncio.wait_for(anext(values), 5) == "h100"
    await values.aclose()
    assert watcher.reconnects == 0, "the watch was refused"
    # pods list + watch: this node's pods, and one that comes later
    pods = NodePods(agent, node)
    stop = asyncio.Event()
    running = asyncio.create_task(pods.run(stop))
    try:
        victim = _create(control_plane, {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "victim", "namespace": namespace}, "spec": {
            "nodeName": node, "serviceAccountName": installed["account"],
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "x"}]}})  # fmt: skip
        deadline = time.monotonic() + 5
        while "victim" not in {p.name for p in pods.pods() or ()}:
            assert time.monotonic() < deadline, f"never seen: reconnects={pods.reconnects}"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await running
    assert pods.reconnects == 0
    # events create + patch, in its own namespace, about its own Pod
    events = NodeEvents(agent, node, agent=AgentPod(namespace, "agent", installed["pod_uid"]))
    assert await events.post("ConfigApplied", "a100")
    assert await events.post("ConfigApplied", "a100"), "the repeat patches the count"
    listed = json.loads(_ok(control_plane, "get", "events", "-n", namespace, "-o", "json"))
    assert [e["count"] for e in listed["items"] if e["reason"] == "ConfigApplied"] == [2]
    # events create + patch about a ResourceClaim, in the claim's namespace (dra.enabled)
    claims = ClaimEvents(agent, node)
    uid = str(uuid.uuid4())
    assert await claims.post("default", "ts", uid, "ClaimConfigNotApplied", "kept")
    assert await claims.post("default", "ts", uid, "ClaimConfigNotApplied", "kept")
    listed = json.loads(_ok(control_plane, "get", "events", "-n", "default", "-o", "json"))
    told = [e for e in listed["items"] if e["involvedObject"].get("uid") == uid]
    assert [(e["involvedObject"]["kind"], e["count"]) for e in told] == [("ResourceClaim", 2)]
    # pods/eviction create (memoryGuard.action=evict)
    assert await PodEvictor(agent).evict(namespace, victim["metadata"]["name"])
    # resourceclaims list + get (a claim that is not there: authorised, then not found)
    dra = DraApi(agent, node, DRIVER)
    assert isinstance(await dra.list_claims(), list)
    with pytest.raises(Exception, match="not found"):
        await dra.get_claim("default", "no-such-claim")
    assert await dra.node_uid()


def test_the_granted_rules_are_the_documented_table(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    """What the API server's authorizer says the agent may do (a SelfSubjectRulesReview with
    its token) is docs/install.md's "API access" table, nothing more."""
    from tests.chart.api_access import TABLE

    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
              "spec": {"namespace": installed["namespace"]}}  # fmt: skip
    done = control_plane.kubectl(
        "--kubeconfig", installed["kubeconfig"], "create", "--validate=false", "-o", "json",
        "-f", "-", stdin=json.dumps(review),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rules = json.loads(done.stdout)["status"]["resourceRules"]
    allowed = {
        (group, resource, verb)
        for r in rules
        for group in r.get("apiGroups", [])
        if group in ("", "resource.k8s.io")
        for resource in r.get("resources", [])
        for verb in r["verbs"]
    }
    documented = {(row["group"], row["resource"], v) for row in TABLE for v in row["verbs"]}
    assert allowed == documented


def test_events_only_in_the_agents_namespace_but_claims_warnings_in_theirs(
    control_plane: envtest.ControlPlane, installed: dict[str, str]
) -> None:
    """Its own Events in its namespace (a Role); with `dra.enabled` (installed here) Events in
    every namespace too (a ClusterRole), which the chart's policy narrows to Events about
    ResourceClaims, what a claim's warnings are."""

    def event(namespace: str, kind: str = "Pod", api: str = "v1") -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "agent.", "namespace": namespace},
            "involvedObject": {"kind": kind, "apiVersion": api, "name": "x",
                               "namespace": namespace},
            "reason": "ConfigApplied", "message": "x", "type": "Normal",
        })  # fmt: skip

    def create(text: str) -> str:
        done = control_plane.kubectl(
            "create", "--validate=false", "-f", "-", stdin=text,
            as_user=installed["user"], extra=[(NODE_EXTRA, installed["node"])],
        )  # fmt: skip
        return "" if done.returncode == 0 else done.stderr

    assert create(event(installed["namespace"])) == ""
    assert "only Events about ResourceClaims" in create(event("kube-system"))
    assert create(event("kube-system", "ResourceClaim", "resource.k8s.io/v1")) == ""
