"""DRA devices and slices: NVIDIA's names and attributes, health taints, slice limits and
the generation rule for republishing."""

from __future__ import annotations

import dataclasses

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.publish import (
    Health,
    cordon_taints,
    device_json,
    dra_devices,
    plan_slices,
    semver,
    slice_specs,
    taints,
)

DRIVER = "gpu.nvidia.com"


def inventory(node: str) -> Inventory:
    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


def test_whole_gpus_are_named_by_minor_with_nvidias_attributes() -> None:
    inv = inventory("sim:2xh100-80gb")
    devices = dra_devices(inv)
    assert [d.name for d in devices] == [f"gpu-{g.minor}" for g in inv.gpus]
    attrs = device_json(devices[0], [])["attributes"]
    gpu = inv.gpus[0]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["uuid"] == {"string": gpu.uuid}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": semver(inv.driver_version)}
    assert attrs["resource.kubernetes.io/pciBusID"]["string"].count(":") == 2
    assert device_json(devices[0], [])["capacity"]["memory"] == {
        "value": str(gpu.memory_mib * 1024 * 1024)
    }


def test_the_pcie_root_is_published_for_gpus_and_their_mig_devices() -> None:
    """Kubernetes' `resource.kubernetes.io/pcieRoot`, as NVIDIA's driver publishes it: on
    whole GPUs and, the parent's, on MIG devices; left out where the backend found none."""
    inv = inventory("sim:4xh100-80gb")
    roots = [
        device_json(d, [])["attributes"]["resource.kubernetes.io/pcieRoot"]
        for d in dra_devices(inv)
    ]
    expected = ("pci0000:00", "pci0000:00", "pci0000:10", "pci0000:10")
    assert roots == [{"string": r} for r in expected]
    mig = inventory("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2")
    for device in dra_devices(mig):
        attrs = device_json(device, [])["attributes"]
        assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": mig.gpus[0].pcie_root}
    unknown = dataclasses.replace(inv, gpus=(dataclasses.replace(inv.gpus[0], pcie_root=None),))
    [device] = dra_devices(unknown)
    assert "resource.kubernetes.io/pcieRoot" not in device_json(device, [])["attributes"]


def test_versions_are_normalised_like_nvidias() -> None:
    assert semver("580.95.05") == "580.95.5"
    assert semver("550.54") == "550.54.0"


def test_a_mig_gpu_publishes_its_mig_devices_only_with_profile_ids() -> None:
    inv = inventory("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2")
    devices = dra_devices(inv)
    assert [d.name for d in devices] == [
        "gpu-0-mig-3g20gb-9-4",
        "gpu-0-mig-2g10gb-14-2",
        "gpu-0-mig-1g5gb-19-0",
        "gpu-0-mig-1g5gb-19-1",
    ]
    first = device_json(devices[0], [])
    assert first["attributes"]["type"] == {"string": "mig"}
    assert first["attributes"]["profile"] == {"string": "3g.20gb"}
    assert first["attributes"]["parentUUID"] == {"string": inv.gpus[0].uuid}
    assert {k for k in first["capacity"] if k.startswith("memorySlice")} == {
        "memorySlice4",
        "memorySlice5",
        "memorySlice6",
        "memorySlice7",
    }
    assert first["capacity"]["multiprocessors"] == {"value": "42"}


def test_media_extension_and_double_memory_profiles() -> None:
    inv = inventory("sim:1xh100-80gb/mig=1g.10gb+me*1+1g.20gb*1")
    names = sorted(d.name for d in dra_devices(inv))
    assert names == ["gpu-0-mig-1g10gb-me-20-0", "gpu-0-mig-1g20gb-15-6"]


def test_health_taints_use_nvidias_keys_in_the_drivers_domain() -> None:
    inv = inventory("sim:2xh100-80gb")
    d0, d1 = dra_devices(inv)
    health = Health({inv.gpus[0].uuid: 79, inv.gpus[1].uuid: None})
    when = "2026-11-23T00:00:00Z"
    assert taints(d0, health, DRIVER, when) == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "timeAdded": when}
    ]
    assert taints(d1, health, DRIVER, when) == [
        {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule", "timeAdded": when}
    ]
    assert taints(d0, Health({}), DRIVER, when) == []


def fake_devices(n: int, tainted: bool = False) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"name": f"gpu-{i}"} for i in range(n)]
    if tainted:
        out[0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    return out


@pytest.mark.parametrize(
    ("n", "tainted", "sizes"),
    [(0, False, [0]), (8, False, [8]), (128, False, [128]), (129, False, [128, 1]),
     (129, True, [64, 65])],
)  # fmt: skip
def test_slices_hold_at_most_128_devices_or_64_with_taints(
    n: int, tainted: bool, sizes: list[int]
) -> None:
    specs = slice_specs(fake_devices(n, tainted), driver=DRIVER, node="n1", generation=3)
    assert [len(s["devices"]) for s in specs] == sizes
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {len(sizes)}
    assert {s["pool"]["name"] for s in specs} == {"n1"}
    assert {s["nodeName"] for s in specs} == {"n1"}


def test_first_publish_creates_owned_slices_at_generation_1() -> None:
    changes = plan_slices([], fake_devices(2), driver=DRIVER, node="n1", node_uid="uid-1")
    [created] = changes.create
    assert created["spec"]["pool"]["generation"] == 1
    assert created["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert created["metadata"]["generateName"].startswith("n1-gpu.nvidia.com-00-")
    assert (changes.update, changes.delete) == ((), ())


def stored(specs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [
        {"metadata": {"name": f"s{i}", "resourceVersion": "7"}, "spec": s}
        for i, s in enumerate(specs)
    ]


def test_unchanged_devices_publish_nothing_and_a_change_bumps_every_slice() -> None:
    existing = stored(slice_specs(fake_devices(130), driver=DRIVER, node="n1", generation=4))
    same = plan_slices(existing, fake_devices(130), driver=DRIVER, node="n1", node_uid="u")
    assert same.empty
    fewer = plan_slices(existing, fake_devices(3), driver=DRIVER, node="n1", node_uid="u")
    assert [s["spec"]["pool"]["generation"] for s in fewer.update] == [5]
    assert fewer.update[0]["metadata"] == {"name": "s0", "resourceVersion": "7"}
    assert fewer.delete == ("s1",)
    assert fewer.create == ()


def test_brand_follows_nvml_spelling_from_the_product_name() -> None:
    from gpuslice.core.dra.publish import _brand

    assert _brand("Tesla T4") == "Tesla"
    assert _brand("NVIDIA H100 80GB HBM3") == "Nvidia"
    assert _brand("NVIDIA GeForce RTX 3060") == "GeForceRTX"
    assert _brand("NVIDIA RTX A6000") == "NvidiaRTX"
    assert _brand("Quadro RTX 8000") == "QuadroRTX"
    assert _brand("NVIDIA L40S") == "Nvidia"
    attrs = device_json(dra_devices(inventory("sim:1xt4"))[0], [])["attributes"]
    assert attrs["brand"] == {"string": "Tesla"}


def test_an_ignored_xid_is_an_informational_taint_and_an_unhealthy_one_wins() -> None:
    """NVIDIA's DRA driver: an ignored XID keeps the `xid` key with effect `None`; one
    taint per key, so the device's unhealthy state (NoSchedule) takes it over."""
    inv = inventory("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2")
    devices = dra_devices(inv)
    gpu = inv.gpus[0]
    one = devices[1]
    noticed = Health({}, noticed={one.uuid: 43})
    assert taints(one, noticed, DRIVER, "t") == [
        {"key": f"{DRIVER}/xid", "value": "43", "effect": "None", "timeAdded": "t"}
    ]
    assert taints(devices[0], noticed, DRIVER, "t") == []
    whole = Health({}, noticed={gpu.uuid: 13})
    assert all(taints(d, whole, DRIVER, "t")[0]["value"] == "13" for d in devices)
    both = Health({gpu.uuid: 79}, noticed={one.uuid: 43})
    assert taints(one, both, DRIVER, "t") == [
        {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule", "timeAdded": "t"}
    ]


def test_a_cordoned_gpu_and_its_mig_devices_get_the_cordon_taint() -> None:
    inv = inventory("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2")
    devices = dra_devices(inv)
    by_gpu = Health({}, cordoned=frozenset({inv.gpus[0].uuid}))
    expected = [{"key": "gpuslice.io/gpu-cordon", "effect": "NoSchedule", "timeAdded": "t"}]
    assert all(cordon_taints(d, by_gpu, "t") == expected for d in devices)
    one = Health({}, cordoned=frozenset({devices[2].uuid}))
    assert [bool(cordon_taints(d, one, "t")) for d in devices] == [False, False, True, False]
    assert cordon_taints(devices[0], Health({}), "t") == []
