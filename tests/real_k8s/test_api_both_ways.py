"""The agent's own API calls, against the double and a real kube-apiserver alike."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lightkube import AsyncClient

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.labels import gfd_labels
from gpuslice.core.sharing.plan import build_plan
from gpuslice.k8s import AgentPod, NodeEvents, NodeLabeler, PodEvents
from gpuslice.testing.kubes import DoubleKube, RealKube

CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


def fixed_clock() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_labels_are_applied_and_retracted_by_their_field_manager(
    kube: RealKube | DoubleKube, client: AsyncClient
) -> None:
    """Server-side apply: a label the agent no longer applies is removed; a label someone
    else wrote is never touched, across a new labeler (an agent restart)."""
    node = kube.name("gpu-1")
    kube.add_node(node, {CONFIG_LABEL: "a100", "nvidia.com/gpu.present": "true"})
    labeler = NodeLabeler(client, node)
    await labeler.apply(
        {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4"}
    )
    labels = kube.node(node)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.replicas"] == "4"
    await labeler.apply({"nvidia.com/gpu.product": "Tesla-T4"})
    labels = kube.node(node)["metadata"]["labels"]
    assert "nvidia.com/gpu.replicas" not in labels
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    await NodeLabeler(client, node).clear()
    meta = kube.node(node)["metadata"]
    assert {k: v for k, v in meta["labels"].items() if k.startswith("nvidia.com/")} == {
        CONFIG_LABEL: "a100",
        "nvidia.com/gpu.present": "true",
    }
    assert not meta.get("annotations"), "nothing but labels is written"


async def test_agent_events_live_in_its_namespace_about_its_pod(
    kube: RealKube | DoubleKube, client: AsyncClient
) -> None:
    node = kube.name("gpu-2")
    kube.add_node(node)
    namespace = kube.name("gpuslice")
    kube.namespace(namespace)
    agent = AgentPod(namespace, "gpuslice-agent-x7k2p", "4b1d0c2e-0000-4000-8000-000000000001")
    events = NodeEvents(client, node, clock=fixed_clock, agent=agent)
    for _ in range(2):
        assert await events.post("ConfigRejected", "replicas: must be >= 1", type="Warning")
    pods = PodEvents(client, node, clock=fixed_clock, agent=agent)
    assert await pods.post(
        "ml", "train", "4b1d0c2e-0000-4000-8000-000000000002", "GPUMemoryReclaimed", "x"
    )
    posted = sorted(kube.events(namespace), key=lambda e: str(e["reason"]))
    assert [(e["reason"], e["count"]) for e in posted] == [
        ("ConfigRejected", 2),
        ("GPUMemoryReclaimed", 1),
    ]
    rejected, reclaimed = posted
    assert rejected["involvedObject"]["name"] == "gpuslice-agent-x7k2p"
    assert (rejected["related"]["kind"], rejected["related"]["name"]) == ("Node", node)
    assert rejected["message"] == f"Node {node}: replicas: must be >= 1"
    assert (reclaimed["related"]["namespace"], reclaimed["related"]["name"]) == ("ml", "train")


async def test_a_node_event_outside_default_is_refused(
    kube: RealKube | DoubleKube, client: AsyncClient
) -> None:
    """Why the events are about the agent's Pod: the API server takes an Event about a
    Node only in `default` (422 "does not match event.namespace" elsewhere)."""
    node = kube.name("gpu-3")
    kube.add_node(node)
    namespace = kube.name("gpuslice")
    kube.namespace(namespace)
    assert not await NodeEvents(client, node, namespace).post("ConfigApplied", "x")
    assert await NodeEvents(client, node, "default").post("ConfigApplied", "x")


@pytest.mark.parametrize(
    ("spec", "config", "machine"),
    [
        ("sim:2xh100-80gb", "version: v1\n", "PowerEdge XE9680"),
        ("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2", MIXED, "p4d.24xlarge"),
        ("sim:1xt4", SHARED, "ThinkSystem SR670 V2 -[7Z22CTO1WW]-"),
        ("sim:1xl40s", "version: v1\n", "X" * 40 + " " + "Y" * 40),
    ],
    ids=["whole", "mig-mixed", "shared-lenovo", "long-machine"],
)
async def test_every_gfd_label_is_a_valid_label(
    kube: RealKube | DoubleKube, client: AsyncClient, spec: str, config: str, machine: str
) -> None:
    """The whole GFD label set of a node, DMI machine names as vendors write them (Lenovo's
    end in `-[MTM]-`, which sanitised ends in `-`), is taken by the API server as is: a
    value it refuses fails the whole apply, and the node would carry no label at all."""
    node = kube.name("gfd")
    kube.add_node(node)
    backend = open_backend(spec)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    plan = build_plan(inventory, parse_config(config))
    labels = gfd_labels(inventory, plan, timestamp=1700000000, machine_type=machine)
    await NodeLabeler(client, node).apply(labels)
    stored = kube.node(node)["metadata"]["labels"]
    assert {k: v for k, v in stored.items() if k in labels} == labels
