"""NodeEvents, NodeLabeler and make_client against the API server double over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from lightkube import AsyncClient

from gpuslice.k8s import AgentPod, ClientSettingsError, NodeEvents, NodeLabeler, make_client
from gpuslice.testing.apiserver import FakeApiServer

LABEL = "nvidia.com/device-plugin.config"


def fixed_clock() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_in_a_pod_events_are_about_the_agent_pod_in_its_namespace(
    api: FakeApiServer, client: AsyncClient
) -> None:
    """The agent may write Events in its own namespace only, and the API server takes an
    Event only in the namespace of what it is about: so the agent's Pod, with the Node in
    `related` and in the message."""
    node = api.add_node("gpu-1")
    agent = AgentPod("gpuslice", "gpuslice-agent-x7k2p", "pod-uid-1")
    events = NodeEvents(client, "gpu-1", "default", clock=fixed_clock, agent=agent)
    ok = await events.post(
        "ConfigRejected", "sharing.mps.resources[0].replicas: must be >= 1", type="Warning"
    )
    assert ok
    assert api.events("default") == []
    [posted] = api.events("gpuslice")
    assert posted["reason"] == "ConfigRejected"
    assert posted["type"] == "Warning"
    assert posted["message"] == "Node gpu-1: sharing.mps.resources[0].replicas: must be >= 1"
    assert posted["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "gpuslice-agent-x7k2p",
        "namespace": "gpuslice",
        "uid": "pod-uid-1",
    }
    assert posted["related"]["kind"] == "Node"
    assert posted["related"]["name"] == "gpu-1"
    assert posted["related"]["uid"] == node["metadata"]["uid"]
    assert posted["source"] == {"component": "gpuslice", "host": "gpu-1"}
    assert posted["firstTimestamp"] == "2025-01-02T03:04:05Z"
    assert posted["count"] == 1
    # a repeat counts up in the same namespace
    assert await events.post(
        "ConfigRejected", "sharing.mps.resources[0].replicas: must be >= 1", type="Warning"
    )
    [posted] = api.events("gpuslice")
    assert posted["count"] == 2


async def test_outside_a_pod_the_event_is_on_the_node_in_default(
    api: FakeApiServer, client: AsyncClient
) -> None:
    node = api.add_node("gpu-1")
    events = NodeEvents(client, "gpu-1", clock=fixed_clock)
    assert await events.post("ConfigApplied", "config a100 applied")
    [posted] = api.events("default")
    assert posted["involvedObject"]["kind"] == "Node"
    assert posted["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert posted["message"] == "config a100 applied"


async def test_a_node_event_outside_default_is_refused_as_the_api_server_does(
    api: FakeApiServer, client: AsyncClient
) -> None:
    """kube-apiserver 1.36.2 answers 422 "involvedObject.namespace: does not match
    event.namespace"; the double agrees, so no test can pass on what a cluster refuses."""
    api.add_node("gpu-1")
    assert not await NodeEvents(client, "gpu-1", "gpuslice").post("ConfigApplied", "x")
    assert api.events() == []


async def test_repeated_event_counts_up(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_node("gpu-1")
    events = NodeEvents(client, "gpu-1")
    for _ in range(3):
        assert await events.post("ConfigRejected", "bad", type="Warning")
    assert await events.post("ConfigApplied", "config a100 applied")
    posted = sorted(api.events("default"), key=lambda e: e["reason"])
    assert [(e["reason"], e["count"]) for e in posted] == [
        ("ConfigApplied", 1),
        ("ConfigRejected", 3),
    ]


async def test_long_messages_are_cut(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_node("gpu-1")
    assert await NodeEvents(client, "gpu-1").post("ConfigRejected", "x" * 5000)
    [posted] = api.events()
    assert len(posted["message"]) == 1024
    assert posted["message"].endswith("...")


async def test_event_failure_is_reported_not_raised(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_node("gpu-1")
    events = NodeEvents(client, "gpu-1")
    assert await events.post("ConfigApplied", "warm up")  # reads the node UID
    api.fail_next_requests(1, status=500)
    assert not await events.post("ConfigRejected", "bad", type="Warning")
    assert await events.post("ConfigRejected", "bad", type="Warning")


async def test_event_without_readable_node_uses_its_name(
    api: FakeApiServer, client: AsyncClient
) -> None:
    assert await NodeEvents(client, "ghost").post("ConfigApplied", "ok")
    [posted] = api.events()
    assert posted["involvedObject"]["uid"] == "ghost"


async def test_labeler_sets_and_retracts_only_its_own_labels(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_node("gpu-1", {LABEL: "a100", "nvidia.com/gpu.present": "true"})
    labeler = NodeLabeler(client, "gpu-1")
    await labeler.apply(
        {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4"}
    )
    labels = api.node("gpu-1")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"

    await labeler.apply({"nvidia.com/gpu.product": "Tesla-T4"})
    labels = api.node("gpu-1")["metadata"]["labels"]
    assert "nvidia.com/gpu.replicas" not in labels
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"

    # a new labeler (agent restart): the API server remembers what its field manager applied
    await NodeLabeler(client, "gpu-1").clear()
    node = api.node("gpu-1")
    assert node["metadata"]["labels"] == {LABEL: "a100", "nvidia.com/gpu.present": "true"}
    assert not node["metadata"].get("annotations"), "nothing but labels is written"


async def test_client_from_kubeconfig_file(api: FakeApiServer, tmp_path: Path) -> None:
    path = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.add_node("gpu-1", {LABEL: "x"})
    client = make_client(path, trust_env=False)
    try:
        await NodeLabeler(client, "gpu-1").apply({"nvidia.com/gpu.count": "1"})
    finally:
        await client.close()
    assert api.node("gpu-1")["metadata"]["labels"]["nvidia.com/gpu.count"] == "1"


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClientSettingsError, match="cannot load kubeconfig"):
        make_client(tmp_path / "nope")


def test_no_service_account_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClientSettingsError, match="in-cluster service account"):
        make_client(None, service_account_dir=tmp_path)
