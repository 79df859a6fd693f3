"""Dynamic MIG against the real kube-apiserver and kube-scheduler (1.36, partitionable
devices on by default): the server takes the slices a dynamic GPU publishes (counter sets in
slices of their own, at most 64 devices per slice), and the scheduler, counting the counters,
allocates exactly the MIG devices that fit together on the GPU.

No kubelet runs: claims are created directly and reserved by pods the scheduler only binds
(as in `test_claims_by_the_real_scheduler`). Every test has a Node of its own, selected by
its pods' label, so no claim lands on another test's devices."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import AsyncClient

from gpuslice.backends import open_backend
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.partitions import dynamic_gpus, node_devices, with_consumption
from gpuslice.core.dra.publish import device_json, dra_devices, plan_slices
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.testing import envtest

Json = dict[str, Any]
DRIVER = "gpu.nvidia.com"
NAMESPACE = "dynmig"
NODE_LABEL = "gpuslice.test/node"


def create(plane: envtest.ControlPlane, obj: Json) -> None:
    done = plane.kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(obj))
    assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr


def _class(name: str, kind: str) -> Json:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


@pytest.fixture(scope="module")
def plane(control_plane: envtest.ControlPlane) -> envtest.ControlPlane:
    if not control_plane.scheduler:
        pytest.skip(f"no kube-scheduler in {envtest.ASSETS_ENV}")
    for obj in (_class("gpu.nvidia.com", "gpu"), _class("mig.nvidia.com", "mig")):
        create(control_plane, obj)
    create(
        control_plane, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    create(control_plane, {"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "default", "namespace": NAMESPACE}})  # fmt: skip
    return control_plane


def published(inventory: Inventory, dynamic: tuple[str, ...]) -> tuple[list[Json], list[Json]]:
    """The devices and counter sets the node publishes with `dynamic` GPUs marked dynamic."""
    dyn = dynamic_gpus(inventory, dynamic)
    devices = []
    for device in node_devices(dra_devices(inventory), dyn):
        obj = device_json(device, [])
        owner = dyn.get(device.gpu.uuid)
        devices.append(with_consumption(obj, owner) if owner is not None else obj)
    return devices, [d.counter_set for d in dyn.values()]


@dataclass
class Node:
    plane: envtest.ControlPlane
    name: str
    api: DraApi
    inventory: Inventory

    async def publish(self, dynamic: tuple[str, ...] = ("all",)) -> list[Json]:
        devices, sets = published(self.inventory, dynamic)
        changes = plan_slices(
            await self.api.list_slices(),
            devices,
            driver=DRIVER,
            node=self.name,
            node_uid="",
            counter_sets=sets,
        )
        for obj in changes.create:
            await self.api.create_slice(obj)
        for obj in changes.update:
            await self.api.replace_slice(obj)
        for name in changes.delete:
            await self.api.delete_slice(name)
        return await self.api.list_slices()

    def claim(self, name: str, profile: str | None = None, cls: str = "mig.nvidia.com") -> None:
        request: Json = {"deviceClassName": cls}
        if profile is not None:
            expression = f"device.attributes['{DRIVER}'].profile == '{profile}'"
            request["selectors"] = [{"cel": {"expression": expression}}]
        create(self.plane, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{self.name}-{name}", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        })  # fmt: skip
        spec: Json = {
            "nodeSelector": {NODE_LABEL: self.name},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{self.name}-{name}"}],
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        }  # fmt: skip
        meta = {"name": f"{self.name}-{name}", "namespace": NAMESPACE}
        create(self.plane, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})

    def delete(self, name: str) -> None:
        """Delete claim `name` and its pod, and do what the controller-manager (not run
        here) would: deallocate the claim and let it go, which gives back its counters."""
        full = f"{self.name}-{name}"
        done = self.plane.kubectl(
            "delete", "pod", "-n", NAMESPACE, full, "--wait=false", "--grace-period=0", "--force"
        )
        assert done.returncode == 0, done.stderr
        for args in (
            ("--subresource=status", "-p", '{"status":{"allocation":null,"reservedFor":null}}'),
            ("-p", '{"metadata":{"finalizers":null}}'),
        ):
            done = self.plane.kubectl(
                "patch", "resourceclaim", "-n", NAMESPACE, full, "--type=merge", *args
            )
            assert done.returncode == 0, done.stderr
        done = self.plane.kubectl("delete", "resourceclaim", "-n", NAMESPACE, full)
        assert done.returncode == 0, done.stderr

    async def device(self, name: str) -> str:
        """The device the scheduler allocated to claim `name`."""
        async with asyncio.timeout(30):
            while True:
                obj = await self.api.get_claim(NAMESPACE, f"{self.name}-{name}")
                allocation = (obj.get("status") or {}).get("allocation")
                if allocation:
                    [result] = allocation["devices"]["results"]
                    return str(result["device"])
                await asyncio.sleep(0.1)

    async def unschedulable(self, name: str) -> str:
        async with asyncio.timeout(30):
            while True:
                done = self.plane.kubectl(
                    "get", "pod", "-n", NAMESPACE, f"{self.name}-{name}", "-o", "json"
                )
                assert done.returncode == 0, done.stderr
                for cond in (json.loads(done.stdout).get("status") or {}).get("conditions") or ():
                    if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                        return str(cond.get("message", ""))
                await asyncio.sleep(0.1)


_NODES = itertools.count()


@pytest.fixture
async def make_node(plane: envtest.ControlPlane) -> AsyncIterator[Callable[[str], Awaitable[Node]]]:
    clients: list[AsyncClient] = []

    async def make(spec: str) -> Node:
        name = f"dynmig-{next(_NODES)}"
        create(plane, {"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "labels": {NODE_LABEL: name}}})  # fmt: skip
        status = {"status": {"allocatable": {"pods": "20", "cpu": "8", "memory": "16Gi"},
                             "capacity": {"pods": "20", "cpu": "8", "memory": "16Gi"}}}  # fmt: skip
        patched = plane.kubectl(
            "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )
        assert patched.returncode == 0, patched.stderr
        backend = open_backend(spec, environ={})
        try:
            inventory = backend.inventory()
        finally:
            backend.close()
        client = make_client(plane.kubeconfig, trust_env=False)
        clients.append(client)
        return Node(plane, name, DraApi(client, name, DRIVER), inventory)

    try:
        yield make
    finally:
        for client in clients:
            await client.close()


async def test_eight_dynamic_h100s_are_taken_as_published(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """208 devices and 8 counter sets: four device slices of at most 64, one counter slice;
    what the server stores reads back as published, so a second publish writes nothing."""
    node = await make_node("sim:8xh100-80gb/mig=")
    stored = await node.publish()
    devices = [s for s in stored if s["spec"].get("devices")]
    counters = [s for s in stored if s["spec"].get("sharedCounters")]
    assert [len(s["spec"]["devices"]) for s in devices] == [64, 64, 64, 16]
    assert [len(s["spec"]["sharedCounters"]) for s in counters] == [8]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {5}
    assert await node.publish() == stored


async def test_seven_1g_claims_fit_an_h100_and_the_eighth_waits(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    for i in range(8):
        node.claim(f"c{i}", "1g.10gb")
    got = []
    for i in range(7):
        got.append(await node.device(f"c{i}"))
    assert sorted(got) == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
    message = await node.unschedulable("c7")
    assert "cannot allocate all claims" in message or "resourceclaim" in message.lower(), message

    node.delete("c3")  # its counters come back: the eighth gets the freed placement
    assert await node.device("c7") == got[3]


async def test_a_4g_and_a_3g_fit_together(make_node: Callable[[str], Awaitable[Node]]) -> None:
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    node.claim("big", "4g.40gb")
    node.claim("half", "3g.40gb")
    assert await node.device("big") == "gpu-0-mig-4g40gb-5-0"
    assert await node.device("half") == "gpu-0-mig-3g40gb-9-4"
    node.claim("more", "1g.10gb")  # nothing is left: 7 of 7 compute slices, 8 of 8 memory
    await node.unschedulable("more")


async def test_the_whole_gpu_blocks_mig_devices_and_the_reverse(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    node.claim("whole", cls="gpu.nvidia.com")
    assert await node.device("whole") == "gpu-0"
    node.claim("small", "1g.10gb")
    await node.unschedulable("small")
    node.delete("whole")
    assert await node.device("small") == "gpu-0-mig-1g10gb-19-0"
    node.claim("whole2", cls="gpu.nvidia.com")
    await node.unschedulable("whole2")
