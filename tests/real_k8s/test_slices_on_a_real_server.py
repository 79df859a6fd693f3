"""ResourceSlices published by the agent's own publisher, to the double and to a real
kube-apiserver (DRA's gates on) alike: the server accepts them as written (attributes,
capacities, MIG devices, shared GPUs' consumable capacity, health taints), and what it
stores reads back as what the agent wants, so the next publish writes nothing (a spelling
the server changed would republish forever). The slices belong to their Node (an owner
reference with its UID) and carry the generation the server keeps."""

from __future__ import annotations

import re
import uuid

import pytest
from lightkube import ApiError

from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.publish import plan_slices
from gpuslice.core.sharing.plan import build_plan
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.state import PlanState
from gpuslice.testing.kubes import Kube

DRIVER = "gpu.nvidia.com"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


@pytest.mark.parametrize(
    ("spec", "config", "expected"),
    [
        ("sim:2xh100-80gb", "version: v1\n", 2),
        ("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2", "version: v1\n", 4),
        ("sim:1xh100-80gb", SHARED, 1),
    ],
    ids=["whole", "mig", "shared"],
)
async def test_the_server_takes_the_slices_and_a_republish_writes_nothing(
    kube: Kube, spec: str, config: str, expected: int
) -> None:
    node = kube.name(f"dra-{spec.split(':')[1][:9].replace('-', '')}-{expected}")
    node_uid = kube.add_node(node)["metadata"]["uid"]
    uuid.UUID(node_uid)  # the real server's UIDs are RFC 4122 UUIDs; so are the double's
    backend = open_backend(spec, environ={})
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config(config)), inventory)
    client = make_client(kube.kubeconfig, trust_env=False)
    try:
        api = DraApi(client, node, DRIVER)
        publisher = SlicePublisher(api, driver=DRIVER, node=node, snapshot=lambda: state.current)
        first = await publisher.publish_once()
        assert first.create, "published"
        stored = await api.list_slices()
        devices = [d for s in stored for d in s["spec"]["devices"]]
        assert len(devices) == expected
        assert all(s["spec"]["nodeName"] == node for s in stored)
        for obj in stored:
            [owner] = obj["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, node_uid)
            assert obj["metadata"]["generation"] == 1
        for device in devices:
            assert device["attributes"]["uuid"]["string"].startswith(("GPU-", "MIG-"))
        if config == SHARED:
            [gpu] = devices
            assert gpu["allowMultipleAllocations"] is True
            assert set(gpu["capacity"]) >= {"shares", "memory"}
        again = SlicePublisher(api, driver=DRIVER, node=node, snapshot=lambda: state.current)
        second = await again.publish_once()
        assert (second.create, second.update, second.delete) == ((), (), ())
    finally:
        await client.close()


async def test_health_taints_are_stored_as_published(kube: Kube) -> None:
    """A lost GPU and one with an XID become NoSchedule taints (DRADeviceTaints); the
    stored taints, `timeAdded` included, read back as the publisher wants them."""
    node = kube.name("dra-taints")
    kube.add_node(node)
    backend = open_backend("sim:3xh100-80gb", environ={})
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    lost, xid = inventory.gpus[0].uuid, inventory.gpus[1].uuid
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    client = make_client(kube.kubeconfig, trust_env=False)
    try:
        api = DraApi(client, node, DRIVER)
        publisher = SlicePublisher(api, driver=DRIVER, node=node, snapshot=lambda: state.current)
        await publisher.publish_once()
        state.publish(unhealthy=frozenset({lost, xid}), last_xid={xid: 79})
        changes = await publisher.publish_once()
        assert changes.update
        assert not changes.create
        [stored] = await api.list_slices()
        assert stored["metadata"]["generation"] == 2
        taints = {d["name"]: d.get("taints", []) for d in stored["spec"]["devices"]}
        assert [(t["key"], t.get("value"), t["effect"]) for t in taints["gpu-0"]] == [
            (f"{DRIVER}/gpu-lost", None, "NoSchedule")
        ]
        assert [(t["key"], t.get("value"), t["effect"]) for t in taints["gpu-1"]] == [
            (f"{DRIVER}/xid", "79", "NoSchedule")
        ]
        assert taints["gpu-2"] == []
        wanted = publisher.wanted_devices(state.current)
        replan = plan_slices([stored], wanted, driver=DRIVER, node=node, node_uid="")
        assert replan.empty, "the stored taints differ from the published ones"
    finally:
        await client.close()


async def test_informational_and_cordon_taints_are_stored_as_published(kube: Kube) -> None:
    """An ignored XID (effect `None`, Kubernetes 1.35+: this 1.36 server takes it with
    DRADeviceTaints) and an operator's cordon (`gpuslice.io/gpu-cordon`, NoSchedule) are
    stored as published, a cordoned and unhealthy GPU carrying both taints."""
    node = kube.name("dra-info-taints")
    kube.add_node(node)
    backend = open_backend("sim:3xh100-80gb", environ={})
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    g0, g1, g2 = (g.uuid for g in inventory.gpus)
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    client = make_client(kube.kubeconfig, trust_env=False)
    try:
        api = DraApi(client, node, DRIVER)
        publisher = SlicePublisher(api, driver=DRIVER, node=node, snapshot=lambda: state.current)
        state.publish(
            unhealthy=frozenset({g2}),
            noticed={g0: 43},
            cordoned=frozenset({g1, g2}),
            last_xid={g2: 79},
        )
        assert (await publisher.publish_once()).create
        [stored] = await api.list_slices()
        taints = {
            d["name"]: [(t["key"], t.get("value"), t["effect"]) for t in d.get("taints", [])]
            for d in stored["spec"]["devices"]
        }
        cordon = ("gpuslice.io/gpu-cordon", None, "NoSchedule")
        assert taints == {
            "gpu-0": [(f"{DRIVER}/xid", "43", "None")],
            "gpu-1": [cordon],
            "gpu-2": [(f"{DRIVER}/xid", "79", "NoSchedule"), cordon],
        }
        assert publisher.informational
        wanted = publisher.wanted_devices(state.current)
        replan = plan_slices([stored], wanted, driver=DRIVER, node=node, node_uid="")
        assert replan.empty, "the stored taints differ from the published ones"
    finally:
        await client.close()


async def test_an_unknown_taint_effect_is_refused_in_the_words_the_publisher_reads(
    kube: Kube,
) -> None:
    """A server before 1.35 refuses effect `None` as this one refuses an effect it does not
    know: 422 naming `...taints[0].effect: Unsupported value: "<effect>"`, the words on
    which the publisher drops its informational taints instead of publishing nothing."""
    node = kube.name("dra-bad-effect")
    kube.add_node(node)
    client = make_client(kube.kubeconfig, trust_env=False)
    try:
        api = DraApi(client, node, DRIVER)
        devices = [{"name": "gpu-0", "taints": [{"key": "k.example/x", "effect": "Sometimes"}]}]
        spec = {"driver": DRIVER, "nodeName": node, "devices": devices,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}  # fmt: skip
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": f"{node}-bad"}, "spec": spec}  # fmt: skip
        words = 'devices[0].taints[0].effect: Unsupported value: "Sometimes"'
        with pytest.raises(ApiError, match=re.escape(words)):
            await api.create_slice(obj)
    finally:
        await client.close()
