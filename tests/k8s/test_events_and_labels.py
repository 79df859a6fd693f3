"""NodeEvents, NodeLabeler and make_client against the API server double over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from lightkube import AsyncClient

from gpuslice.k8s import ClientSettingsError, NodeEvents, NodeLabeler, make_client
from gpuslice.k8s.labeling import MANAGED_ANNOTATION
from gpuslice.testing.apiserver import FakeApiServer

LABEL = "nvidia.com/device-plugin.config"


def fixed_clock() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_event_is_posted_on_the_node(api: FakeApiServer, client: AsyncClient) -> None:
    node = api.add_node("gpu-1")
    events = NodeEvents(client, "gpu-1", "gpuslice", clock=fixed_clock)
    ok = await events.post(
        "ConfigRejected", "sharing.mps.resources[0].replicas: must be >= 1", type="Warning"
    )
    assert ok
    [posted] = api.events("gpuslice")
    assert posted["reason"] == "ConfigRejected"
    assert posted["type"] == "Warning"
    assert posted["message"] == "sharing.mps.resources[0].replicas: must be >= 1"
    assert posted["involvedObject"]["kind"] == "Node"
    assert posted["involvedObject"]["name"] == "gpu-1"
    assert posted["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert posted["source"] == {"component": "gpuslice", "host": "gpu-1"}
    assert posted["firstTimestamp"] == "2025-01-02T03:04:05Z"
    assert posted["count"] == 1


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

    # a new labeler (agent restart) still knows what was written before
    await NodeLabeler(client, "gpu-1").clear()
    node = api.node("gpu-1")
    assert node["metadata"]["labels"] == {LABEL: "a100", "nvidia.com/gpu.present": "true"}
    assert MANAGED_ANNOTATION not in node["metadata"]["annotations"]


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
