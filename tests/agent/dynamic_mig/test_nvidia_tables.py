"""Every simulated MIG model against NVIDIA's MIG User Guide tables (`tests.mig_guide`,
written out by hand): profile names, NVML profile IDs, compute and memory slices, engines,
instance counts and placements, and the device names NVIDIA's DRA driver gives them
(`gpu-<minor>-mig-<profile>-<profile ID>-<start>`), static and dynamic alike. A claim that
names a device, or a tool that creates an instance by profile ID, gets the GPU NVIDIA's
tables describe."""

from __future__ import annotations

import re

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.partitions import dynamic_gpu
from gpuslice.core.dra.publish import dra_devices
from gpuslice.core.gpumodels import MODELS
from tests.mig_guide import NVIDIA_TABLES, Row


def inventory(spec: str) -> Inventory:
    backend = open_backend(spec)
    try:
        return backend.inventory()
    finally:
        backend.close()


def spelled(profile: str) -> str:
    return re.sub(r"[^a-z0-9-]", "", profile.replace("+", "-"))


def test_every_mig_model_has_its_nvidia_table() -> None:
    assert sorted(NVIDIA_TABLES) == sorted(k for k, m in MODELS.items() if m.mig is not None)


@pytest.mark.parametrize("model", sorted(NVIDIA_TABLES))
def test_the_simulators_profiles_are_nvidias(model: str) -> None:
    geometry = MODELS[model].mig
    assert geometry is not None
    got: list[Row] = [
        (
            p.name,
            p.profile_id if p.profile_id is not None else -1,
            p.compute_slices,
            p.memory_slices,
            p.copy_engines,
            p.decoders,
            p.jpeg,
            p.ofa,
            p.max_instances,
            p.starts,
        )
        for p in geometry.profiles
    ]
    assert got == NVIDIA_TABLES[model]
    assert all(p.encoders == 0 for p in geometry.profiles)  # none of these GPUs has NVENC


@pytest.mark.parametrize("model", sorted(NVIDIA_TABLES))
def test_dynamic_devices_carry_nvidias_profile_ids(model: str) -> None:
    inv = inventory(f"sim:1x{model}/mig=")
    dyn = dynamic_gpu(inv.gpus[0], inv)
    published = {d.name for d in dyn.devices if d.kind == "mig"}
    want = {
        f"gpu-0-mig-{spelled(name)}-{pid}-{start}"
        for name, pid, *_, starts in NVIDIA_TABLES[model]
        for start in starts
    }
    assert published == want


@pytest.mark.parametrize("model", sorted(NVIDIA_TABLES))
def test_static_devices_carry_nvidias_profile_ids(model: str) -> None:
    """Each profile alone, wherever the layout puts it: the name is NVIDIA's."""
    for name, pid, *_, starts in NVIDIA_TABLES[model]:
        [device] = dra_devices(inventory(f"sim:1x{model}/mig={name}*1"))
        assert device.mig is not None
        start = device.mig.placement_start
        assert start in starts, name
        assert device.name == f"gpu-0-mig-{spelled(name)}-{pid}-{start}", name
