"""Dynamic MIG's counters say exactly what the driver's rules say.

The scheduler allocates a set of partitions together iff their consumption fits the GPU's
counter set; the GPU (here the simulator, which keeps the MIG User Guide's rules) creates a
set of instances iff they fit its placement, compute-slice, count and `+me` rules. Were the
two to disagree, the scheduler would hand out a device Prepare cannot create, or would leave
unused a layout the GPU could hold. Every set of placements of every MIG model the simulator
knows is tried both ways."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.simulated.partition import created
from gpuslice.core.devices import Gpu, Inventory, MigDevice
from gpuslice.core.dra.partitions import (
    Partition,
    counter_set,
    dynamic_gpu,
    dynamic_gpus,
    full_counters,
    is_dynamic,
    node_devices,
    partitions,
)
from gpuslice.core.dra.publish import device_json, dra_devices, slice_specs
from gpuslice.core.gpumodels import MODELS
from gpuslice.core.units import Quantity
from gpuslice.ports import BackendError

MIG_MODELS = sorted(k for k, m in MODELS.items() if m.mig is not None)


def inventory(spec: str) -> Inventory:
    backend = open_backend(spec)
    try:
        return backend.inventory()
    finally:
        backend.close()


def disjoint_sets(parts: tuple[Partition, ...]) -> Iterator[tuple[Partition, ...]]:
    """Every set of partitions whose memory slices do not overlap (overlapping ones share a
    memory-slice counter of value 1: the counters refuse them before anything else)."""

    def walk(
        i: int, used: frozenset[int], chosen: tuple[Partition, ...]
    ) -> Iterator[tuple[Partition, ...]]:
        if i == len(parts):
            yield chosen
            return
        yield from walk(i + 1, used, chosen)
        slots = frozenset(parts[i].slots)
        if not slots & used:
            yield from walk(i + 1, used | slots, (*chosen, parts[i]))

    yield from walk(0, frozenset(), ())


def counters_admit(gpu: Gpu, chosen: tuple[Partition, ...]) -> bool:
    assert gpu.mig_geometry is not None
    full = full_counters(gpu.mig_geometry)
    used: dict[str, int] = {}
    for part in chosen:
        for name, value in part.consumes().items():
            used[name] = used.get(name, 0) + value
    return all(value <= full[name] for name, value in used.items())


def driver_admits(gpu: Gpu, chosen: tuple[Partition, ...]) -> bool:
    import dataclasses

    for serial, part in enumerate(chosen):
        try:
            mig = created(gpu, part.profile.name, part.start, serial)
        except BackendError:
            return False
        gpu = dataclasses.replace(gpu, mig_devices=(*gpu.mig_devices, mig))
    return True


@pytest.mark.parametrize("model", MIG_MODELS)
def test_the_counters_admit_exactly_the_layouts_the_gpu_creates(model: str) -> None:
    [gpu] = inventory(f"sim:1x{model}/mig=").gpus
    assert gpu.mig_geometry is not None
    parts = partitions(gpu, gpu.mig_geometry)
    tried = admitted = 0
    for chosen in disjoint_sets(parts):
        tried += 1
        fits = counters_admit(gpu, chosen)
        assert fits == driver_admits(gpu, chosen), [f"{p.profile.name}@{p.start}" for p in chosen]
        admitted += fits
    assert admitted > 10
    assert tried > admitted


@pytest.mark.parametrize(
    ("model", "devices"),
    # per profile its placements: H100/H200/A100 7+7+4+3+2+1+1, A30 4+4+2+2+1
    [("h100-80gb", 25), ("h200", 25), ("a100-40gb", 25), ("a100-80gb", 25), ("a30", 13)],
)
def test_one_device_per_profile_and_placement_and_no_whole_gpu(model: str, devices: int) -> None:
    """The GPU is in MIG mode: CUDA runs only in MIG devices, so the bare GPU is not offered
    (NVIDIA's driver offers it only where it toggles MIG mode itself, Hopper and later;
    gpuslice never changes MIG mode)."""
    inv = inventory(f"sim:1x{model}/mig=")
    dyn = dynamic_gpu(inv.gpus[0], inv)
    assert len(dyn.devices) == devices
    assert "gpu-0" not in dyn.consumption
    whole = full_counters(inv.gpus[0].mig_geometry)  # type: ignore[arg-type]
    for device in dyn.devices:
        assert device.kind == "mig"
        assert "uuid" not in device.attributes
        assert device.attributes["profile"][1] == dyn.partitions[device.name].profile.name
        consumed = dyn.consumption[device.name]
        assert len(consumed) <= 32
        assert all(consumed[k] <= whole[k] for k in consumed)


def test_names_are_the_static_mig_devices_names() -> None:
    """A claim naming a static layout's device names the same instance when dynamic."""
    static = inventory("sim:1xh100-80gb/mig=3g.40gb*1+2g.20gb*1+1g.10gb*2")
    names = {d.name for d in dra_devices(static)}
    dyn = dynamic_gpu(static.gpus[0], static, ours={m.uuid for m in static.gpus[0].mig_devices})
    assert names <= set(dyn.partitions)


def test_a_partition_gpuslice_created_carries_its_mig_device_and_publishes_the_same() -> None:
    inv = inventory("sim:1xh100-80gb/mig=3g.40gb*1")
    [gpu] = inv.gpus
    [mig] = gpu.mig_devices
    bare = replace(gpu, mig_devices=())
    before = dynamic_gpu(bare, replace(inv, gpus=(bare,)))
    after = dynamic_gpu(gpu, inv, ours={mig.uuid})
    [device] = [d for d in after.devices if d.mig is not None]
    assert device.name == "gpu-0-mig-3g40gb-9-4"
    assert device.uuid == mig.uuid
    assert [device_json(d, []) for d in after.devices] == [
        device_json(replace(d, gpu=gpu), []) for d in before.devices
    ]
    assert after.counter_set == before.counter_set  # the scheduler counts our instance


def test_foreign_instances_shrink_the_counters_and_hide_what_they_overlap() -> None:
    inv = inventory("sim:1xh100-80gb/mig=3g.40gb*1")
    [gpu] = inv.gpus
    [theirs] = gpu.mig_devices
    dyn = dynamic_gpu(gpu, inv)  # not created by gpuslice: foreign
    held = set(range(theirs.placement_start, theirs.placement_start + theirs.placement_size))
    assert all(not set(p.slots) & held for p in dyn.partitions.values())
    assert dyn.counter_set is not None
    counters = dyn.counter_set["counters"]
    assert counters["compute-slices"] == {"value": "4"}
    assert all(f"memory-slice-{s}" not in counters for s in held)  # value 0: left out


def test_only_marked_gpus_in_mig_mode_are_dynamic() -> None:
    inv = inventory("sim:1xh100-80gb/mig=,1xh100-80gb,1xl40s")
    mig, plain, other = inv.gpus
    assert is_dynamic(mig, {"all"})
    assert is_dynamic(mig, {mig.uuid})
    assert is_dynamic(mig, {"0"})
    assert not is_dynamic(mig, {"1"})
    assert not is_dynamic(plain, {"all"})  # MIG mode off: a whole GPU, never toggled
    assert not is_dynamic(other, {"all"})
    dyn = dynamic_gpus(inv, {"all"})
    assert list(dyn) == [mig.uuid]
    devices = node_devices(dra_devices(inv), dyn)
    assert [d.name for d in devices][-2:] == ["gpu-1", "gpu-2"]
    assert len(devices) == 25 + 2


def test_slices_keep_devices_and_counter_sets_apart_within_the_limits() -> None:
    inv = inventory("sim:9xh100-80gb/mig=")
    dyn = dynamic_gpus(inv, {"all"})
    devices = [{"name": d.name, "consumesCounters": []} for d in node_devices((), dyn)]
    sets = [d.counter_set for d in dyn.values() if d.counter_set is not None]
    specs = slice_specs(devices, driver="d", node="n", generation=1, counter_sets=sets)
    assert [len(s.get("devices", ())) for s in specs] == [64, 64, 64, 33, 0, 0]
    assert [len(s.get("sharedCounters", ())) for s in specs] == [0, 0, 0, 0, 8, 1]
    assert all(("devices" in s) != ("sharedCounters" in s) for s in specs)
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {6}
    plain = [{"name": f"gpu-{i}"} for i in range(130)]
    assert [len(s["devices"]) for s in slice_specs(plain, driver="d", node="n", generation=1)] == [
        128,
        2,
    ]


def test_a_counter_set_fits_the_api() -> None:
    for model in MIG_MODELS:
        inv = inventory(f"sim:1x{model}/mig=")
        counters = counter_set(inv.gpus[0], inv.gpus[0].mig_geometry)["counters"]  # type: ignore[arg-type]
        assert 0 < len(counters) <= 32
        assert all(v["value"] != "0" for v in counters.values())


def layouts(gpu: Gpu) -> Iterator[tuple[MigDevice, ...]]:
    """Every set of instances the GPU creates together, as the driver makes them."""
    assert gpu.mig_geometry is not None
    for chosen in disjoint_sets(partitions(gpu, gpu.mig_geometry)):
        made: list[MigDevice] = []
        try:
            for serial, part in enumerate(chosen):
                here = replace(gpu, mig_devices=tuple(made))
                made.append(created(here, part.profile.name, part.start, serial))
        except BackendError:
            continue
        yield tuple(made)


@pytest.mark.parametrize("model", MIG_MODELS)
def test_what_someone_elses_instances_leave_is_a_pool_the_scheduler_takes(model: str) -> None:
    """For every layout the GPU holds made by someone else (an operator's `7g`, a `+me`
    holding the one OFA unit, an all-`1g` layout, ...): what the GPU publishes is exactly the
    partitions the driver could still create beside it; every counter a published device
    consumes is in its GPU's set with enough of it (else the scheduler calls the whole pool
    invalid, every GPU of the node); no set is empty (the API refuses the slice), and a GPU
    left with nothing to offer publishes neither devices nor a set."""
    inv = inventory(f"sim:1x{model}/mig=")
    bare = inv.gpus[0]
    assert bare.mig_geometry is not None
    every = partitions(bare, bare.mig_geometry)
    tried = 0
    for theirs in layouts(bare):
        tried += 1
        gpu = replace(bare, mig_devices=theirs)
        dyn = dynamic_gpu(gpu, replace(inv, gpus=(gpu,)))
        what = [f"{m.profile}@{m.placement_start}" for m in theirs]
        creatable = {p.name for p in every if driver_admits(gpu, (p,))}
        assert set(dyn.partitions) == creatable, what
        if dyn.counter_set is None:
            assert dyn.devices == (), what
            continue
        published = dyn.counter_set["counters"].items()
        counters = {k: Quantity.parse(v["value"]).value for k, v in published}
        assert counters, what
        for device in dyn.devices:
            consumed = {k: v for k, v in dyn.consumption[device.name].items() if v > 0}
            assert all(counters.get(k, 0) >= v for k, v in consumed.items()), (what, device.name)
    assert tried > 20


def test_a_gpu_someone_else_filled_publishes_nothing_and_the_others_stay() -> None:
    inv = inventory("sim:2xh100-80gb/mig=")
    full = replace(inv.gpus[0], mig_devices=(created(inv.gpus[0], "7g.80gb", 0, 0),))
    inv = replace(inv, gpus=(full, inv.gpus[1]))
    dyn = dynamic_gpus(inv, {"all"})
    assert dyn[full.uuid].devices == ()
    assert dyn[full.uuid].counter_set is None
    assert len(dyn[inv.gpus[1].uuid].devices) == 25
    assert dyn[inv.gpus[1].uuid].counter_set is not None


def test_someone_elses_me_instance_takes_the_me_partitions_out() -> None:
    inv = inventory("sim:1xh100-80gb/mig=")
    gpu = replace(inv.gpus[0], mig_devices=(created(inv.gpus[0], "1g.10gb+me", 0, 0),))
    dyn = dynamic_gpu(gpu, replace(inv, gpus=(gpu,)))
    profiles = {p.profile.name for p in dyn.partitions.values()}
    assert "1g.10gb+me" not in profiles  # the one OFA unit is held
    assert "7g.80gb" not in profiles  # it needs the OFA unit too, and slot 0
    assert {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb"} <= profiles
    assert dyn.counter_set is not None
    assert "ofa-engines" not in dyn.counter_set["counters"]
