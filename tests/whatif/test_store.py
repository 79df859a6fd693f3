"""The demo's in-memory API (`emulator.dra_store.DraStore`): the port's rules the driver
depends on (generateName, optimistic concurrency, 404s, UIDs), slices published with the
driver's own planning code, and the scheduler played over them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.dra.publish import Health, device_json, dra_devices, plan_slices, taints
from gpuslice.core.jsontypes import Json
from gpuslice.emulator.dra_store import DraStore
from gpuslice.ports import DraConflict, DraObjectNotFound, DraObjects
from gpuslice.whatif.allocator import AllocationError

DRIVER = "gpu.nvidia.com"


def nvidia_class(name: str, kind: str) -> Json:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def published(node_spec: str, health: Health | None = None) -> list[Json]:
    backend = open_backend(node_spec)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    return [
        device_json(d, taints(d, health, DRIVER, "2026-01-01T00:00:00Z") if health else [])
        for d in dra_devices(inventory)
    ]


async def publish(store: DraObjects, devices: list[Json], node: str = "n1") -> None:
    """What the driver's publisher does through the port."""
    changes = plan_slices(
        await store.list_slices(),
        devices,
        driver=DRIVER,
        node=node,
        node_uid=await store.node_uid(),
    )
    for name in changes.delete:
        await store.delete_slice(name)
    for obj in changes.update:
        await store.replace_slice(obj)
    for obj in changes.create:
        await store.create_slice(obj)


def gpu_claim(name: str, **exactly: Any) -> Json:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {"devices": {"requests": [request]}},
    }


@pytest.fixture
def store() -> DraStore:
    s = DraStore("n1", DRIVER, node_uid="node-uid-1")
    s.add_device_class(nvidia_class("gpu.nvidia.com", "gpu"))
    s.add_device_class(nvidia_class("mig.nvidia.com", "mig"))
    return s


async def test_slices_follow_the_apis_rules(store: DraStore) -> None:
    objects: DraObjects = store  # the port the driver is written against
    await publish(objects, published("sim:2xh100-80gb"))
    mine = await objects.list_slices()
    assert len(mine) == 1
    created = mine[0]
    assert created["metadata"]["name"].startswith("n1-gpu.nvidia.com-00-")
    assert created["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    assert created["kind"] == "ResourceSlice"

    other_node = DraStore("n2", DRIVER)
    other_driver = DraStore("n1", "other.example.com")
    assert await other_node.list_slices() == []
    assert await other_driver.list_slices() == []

    stale = dict(created)
    fresh = await objects.replace_slice(dict(created, spec=dict(created["spec"], devices=[])))
    assert fresh["metadata"]["uid"] == created["metadata"]["uid"]
    assert fresh["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    with pytest.raises(DraConflict, match="modified"):
        await objects.replace_slice(stale)
    with pytest.raises(DraConflict, match="already exists"):
        await objects.create_slice({"metadata": {"name": fresh["metadata"]["name"]}, "spec": {}})
    await objects.delete_slice(fresh["metadata"]["name"])
    with pytest.raises(DraObjectNotFound):
        await objects.delete_slice(fresh["metadata"]["name"])
    with pytest.raises(DraObjectNotFound):
        await objects.replace_slice(fresh)
    assert await objects.list_slices() == []


async def test_returned_objects_are_copies(store: DraStore) -> None:
    """The driver may edit what it read (plan_slices does) without changing the store."""
    await publish(store, published("sim:1xh100-80gb"))
    mine = await store.list_slices()
    mine[0]["spec"]["devices"].clear()
    assert len((await store.list_slices())[0]["spec"]["devices"]) == 1
    store.add_claim(gpu_claim("c"))
    read = await store.get_claim("ml", "c")
    read["spec"]["devices"]["requests"].clear()
    assert store.claim("ml", "c")["spec"]["devices"]["requests"]


async def test_claims_have_uids_that_change_when_recreated(store: DraStore) -> None:
    first = store.add_claim(gpu_claim("c"))
    with pytest.raises(DraConflict):
        store.add_claim(gpu_claim("c"))
    assert (await store.get_claim("ml", "c"))["metadata"]["uid"] == first["metadata"]["uid"]
    store.delete_claim("ml", "c")
    with pytest.raises(DraObjectNotFound, match="ml/c"):
        await store.get_claim("ml", "c")
    second = store.add_claim(gpu_claim("c"))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    status: Json = {"allocation": {"devices": {"results": []}}}
    updated = store.set_claim_status("ml", "c", status)
    assert updated["metadata"]["uid"] == second["metadata"]["uid"]
    assert (await store.get_claim("ml", "c"))["status"] == status
    assert "status" not in store.set_claim_status("ml", "c", None)


async def test_allocate_claim_plays_the_scheduler(store: DraStore) -> None:
    await publish(store, published("sim:2xh100-80gb"))
    store.add_claim(gpu_claim("a"))
    store.add_claim(gpu_claim("b"))
    store.add_claim(gpu_claim("c"))
    a = store.allocate_claim("ml", "a", "pod-uid-1", pod_name="trainer")
    b = store.allocate_claim("ml", "b")
    assert a["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert a["status"]["reservedFor"] == [
        {"resource": "pods", "name": "trainer", "uid": "pod-uid-1"}
    ]
    assert b["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
    assert "reservedFor" not in b["status"]
    # what the driver then reads through the port is that allocation
    assert (await store.get_claim("ml", "a"))["status"] == a["status"]

    with pytest.raises(AllocationError, match="allocated to another claim"):
        store.allocate_claim("ml", "c")
    assert "status" not in store.claim("ml", "c")

    # a second pod sharing claim a keeps its devices and joins reservedFor
    shared = store.allocate_claim("ml", "a", "pod-uid-2")
    assert shared["status"]["allocation"] == a["status"]["allocation"]
    assert [r["uid"] for r in shared["status"]["reservedFor"]] == ["pod-uid-1", "pod-uid-2"]
    assert (
        store.allocate_claim("ml", "a", "pod-uid-2")["status"]["reservedFor"]
        == (shared["status"]["reservedFor"])
    )

    store.set_claim_status("ml", "b", None)  # claim b deallocated: its GPU is free again
    c = store.allocate_claim("ml", "c")
    assert c["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
    with pytest.raises(DraObjectNotFound):
        store.allocate_claim("ml", "nope")


async def test_a_kubelet_restart_wipes_slices_until_the_driver_republishes(
    store: DraStore,
) -> None:
    devices = published("sim:1xh100-80gb")
    await publish(store, devices)
    assert store.wipe_slices(driver="other.example.com") == 0
    assert store.wipe_slices() == 1
    store.add_claim(gpu_claim("c"))
    with pytest.raises(AllocationError, match="no device matches"):
        store.allocate_claim("ml", "c")
    await publish(store, devices)
    assert store.allocate_claim("ml", "c")["status"]["allocation"]["devices"]["results"]


async def test_republished_taints_steer_new_claims(store: DraStore) -> None:
    """The driver bumps the generation when health changes; the scheduler uses only it."""
    healthy = published("sim:2xh100-80gb")
    await publish(store, healthy)
    uuid0 = healthy[0]["attributes"]["uuid"]["string"]
    await publish(store, published("sim:2xh100-80gb", Health({uuid0: 79})))
    [current] = store.slices()
    assert current["spec"]["pool"]["generation"] == 2
    store.add_claim(gpu_claim("c"))
    allocated = store.allocate_claim("ml", "c")
    assert allocated["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"


async def test_consumable_shares_through_the_store() -> None:
    numbers = itertools.count(1)
    store = DraStore("n1", DRIVER, share_id=lambda: f"share-{next(numbers)}")
    store.add_device_class(nvidia_class("gpu.nvidia.com", "gpu"))
    devices = published("sim:1xh100-80gb")
    devices[0]["allowMultipleAllocations"] = True
    devices[0]["capacity"]["memory"]["requestPolicy"] = {
        "default": "40779Mi",
        "validRange": {"min": "1Mi", "step": "1Mi"},
    }
    devices[0]["capacity"]["gpuslice.io/shares"] = {
        "value": "2",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "2", "step": "1"}},
    }
    await publish(store, devices)
    for name in ("a", "b", "c"):
        store.add_claim(gpu_claim(name))
    results = [
        store.allocate_claim("ml", n)["status"]["allocation"]["devices"]["results"][0]
        for n in ("a", "b")
    ]
    assert [r["shareID"] for r in results] == ["share-1", "share-2"]
    assert [r["consumedCapacity"] for r in results] == [
        {"memory": "40779Mi", "gpuslice.io/shares": "1"}
    ] * 2
    with pytest.raises(AllocationError, match=r"gpuslice\.io/shares \(asks 1, 0 of 2 left\)"):
        store.allocate_claim("ml", "c")
    store.delete_claim("ml", "a")
    again = store.allocate_claim("ml", "c")["status"]["allocation"]["devices"]["results"][0]
    assert again["shareID"] == "share-3"
