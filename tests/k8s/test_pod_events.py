"""PodEvents and PodEvictor against the API server double over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime

from lightkube import AsyncClient

from gpuslice.k8s import AgentPod, PodEvents, PodEvictor
from gpuslice.testing.apiserver import FakeApiServer

UID = "0f3c2a4e-8b1d-4c5e-9a7f-1234567890ab"


def fixed_clock() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_warning_on_the_pod_and_repeats_bump_the_count(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_node("gpu-1")
    api.add_pod("ml", "train", UID, "gpu-1")
    events = PodEvents(client, "gpu-1", clock=fixed_clock)
    assert await events.post("ml", "train", UID, "GPUMemoryOverShare", "over its share")
    assert await events.post("ml", "train", UID, "GPUMemoryOverShare", "over its share")
    [posted] = api.events("ml")
    assert posted["type"] == "Warning"
    assert posted["count"] == 2
    assert posted["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "train",
        "namespace": "ml",
        "uid": UID,
    }
    assert posted["source"] == {"component": "gpuslice", "host": "gpu-1"}
    assert await events.post("ml", "train", UID, "GPUMemoryReclaimed", "stopped")
    assert sorted(e["reason"] for e in api.events("ml")) == [
        "GPUMemoryOverShare",
        "GPUMemoryReclaimed",
    ]


async def test_a_failed_post_is_reported_not_raised(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.fail_next_requests(1)
    assert not await PodEvents(client, "gpu-1").post("ml", "train", None, "X", "y")


async def test_eviction_deletes_the_pod_or_reports_a_refusal(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_node("gpu-1")
    api.add_pod("ml", "train", UID, "gpu-1")
    evictor = PodEvictor(client)
    api.block_evictions = True
    assert not await evictor.evict("ml", "train")
    assert api.pod("ml", "train")["metadata"]["uid"] == UID
    api.block_evictions = False
    assert await evictor.evict("ml", "train")
    assert api.evictions == [("ml", "train")]
    assert not await evictor.evict("ml", "train"), "already gone: 404"


async def test_in_a_pod_guard_events_are_about_the_agent_and_name_the_pod(
    api: FakeApiServer, client: AsyncClient
) -> None:
    agent = AgentPod("gpuslice", "gpuslice-agent-x7k2p", "pod-uid-1")
    events = PodEvents(client, "gpu-1", clock=fixed_clock, agent=agent)
    for _ in range(2):
        assert await events.post("ml", "train", "uid-9", "GPUMemoryReclaimed", "over its share")
    assert api.events("ml") == [], "nothing outside the agent's namespace"
    [posted] = api.events("gpuslice")
    assert posted["involvedObject"]["name"] == "gpuslice-agent-x7k2p"
    assert posted["related"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "train",
        "namespace": "ml",
        "uid": "uid-9",
    }
    assert posted["message"] == "Pod ml/train: over its share"
    assert posted["count"] == 2
