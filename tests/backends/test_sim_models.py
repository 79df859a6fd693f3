"""The simulated models and MIG tables against published facts (REFERENCE.md Part 2 §2)."""

from __future__ import annotations

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.mignames import mig_profile_name
from gpuslice.backends.simulated.models import MODELS
from gpuslice.core.devices import Inventory
from gpuslice.ports import BackendError
from tests.mig_guide import MAX_INSTANCES


def inventory(spec: str) -> Inventory:
    backend = open_backend(spec, environ={})
    try:
        return backend.inventory()
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("key", "product", "memory_mib", "sms", "cc", "mig"),
    [
        ("t4", "Tesla T4", 15360, 40, (7, 5), False),
        ("rtx-3060", "NVIDIA GeForce RTX 3060", 12288, 28, (8, 6), False),
        ("l40s", "NVIDIA L40S", 46068, 142, (8, 9), False),
        ("a100-40gb", "NVIDIA A100-SXM4-40GB", 40960, 108, (8, 0), True),
        ("a100-80gb", "NVIDIA A100 80GB PCIe", 81920, 108, (8, 0), True),
        ("a30", "NVIDIA A30", 24576, 56, (8, 0), True),
        ("h100-80gb", "NVIDIA H100 80GB HBM3", 81559, 132, (9, 0), True),
        ("h200", "NVIDIA H200", 143771, 132, (9, 0), True),
        ("gb10", "NVIDIA GB10", 0, 48, (12, 1), False),  # unified memory: none reported
    ],
)
def test_model_facts(
    key: str, product: str, memory_mib: int, sms: int, cc: tuple[int, int], mig: bool
) -> None:
    (gpu,) = inventory(f"sim:1x{key}").gpus
    assert gpu.product_name == product
    assert gpu.memory_mib == memory_mib
    assert gpu.multiprocessors == sms
    assert gpu.compute_capability == cc
    assert gpu.mig_capable is mig
    assert gpu.mig_enabled is False
    assert gpu.mig_devices == ()


@pytest.mark.parametrize(
    ("key", "device_id"),
    [
        ("a100-40gb", 0x20B010DE),
        ("a100-80gb", 0x20B510DE),
        ("h100-80gb", 0x233010DE),
        ("h200", 0x233510DE),
    ],
)
def test_pci_device_ids_match_mig_parted_filters(key: str, device_id: int) -> None:
    (gpu,) = inventory(f"sim:1x{key}").gpus
    assert gpu.pci_device_id == device_id


MAX_COUNTS = MAX_INSTANCES
CASES = [(model, profile, n) for model, table in MAX_COUNTS.items() for profile, n in table.items()]


def test_tables_list_exactly_the_guide_profiles() -> None:
    for key, table in MAX_COUNTS.items():
        geometry = MODELS[key].mig
        assert geometry is not None
        assert [p.name for p in geometry.profiles] == list(table)


@pytest.mark.parametrize(("key", "profile", "count"), CASES)
def test_full_single_profile_layout_fits(key: str, profile: str, count: int) -> None:
    (gpu,) = inventory(f"sim:1x{key}/mig={profile}*{count}").gpus
    assert gpu.mig_enabled
    assert [m.profile for m in gpu.mig_devices] == [profile] * count
    assert len({m.placement_start for m in gpu.mig_devices}) == count


@pytest.mark.parametrize(("key", "profile", "count"), CASES)
def test_one_more_than_the_maximum_is_refused(key: str, profile: str, count: int) -> None:
    with pytest.raises(BackendError, match=rf"at most {count} fit"):
        inventory(f"sim:1x{key}/mig={profile}*{count + 1}")


@pytest.mark.parametrize(("key", "profile", "count"), CASES)
def test_all_profile_shorthand(key: str, profile: str, count: int) -> None:
    name = profile.replace("+me", ".me")  # mig-parted's spelling
    (gpu,) = inventory(f"sim:1x{key}/mig=all-{name}").gpus
    assert len(gpu.mig_devices) == count


def test_all_1g_10gb_is_seven_on_80gb_parts_and_four_on_40gb() -> None:
    assert len(inventory("sim:1xa100-80gb/mig=all-1g.10gb").mig_devices()) == 7
    assert len(inventory("sim:1xh100-80gb/mig=all-1g.10gb").mig_devices()) == 7
    assert len(inventory("sim:1xa100-40gb/mig=all-1g.10gb").mig_devices()) == 4


def test_seed_a100_80gb_1g_10gb_facts() -> None:
    # Seed 001: torch reports `total_memory=9728MB, multi_processor_count=14`; GI ids 7..13.
    gpu = inventory("sim:1xa100-80gb/mig=1g.10gb*7").gpus[0]
    assert {m.memory_mib for m in gpu.mig_devices} == {9728}
    assert {m.multiprocessors for m in gpu.mig_devices} == {14}
    assert sorted(m.gi_id for m in gpu.mig_devices) == list(range(7, 14))
    assert {m.ci_id for m in gpu.mig_devices} == {0}


def placements(spec: str) -> list[tuple[str, int, int]]:
    gpu = inventory(spec).gpus[0]
    return sorted((m.profile, m.placement_start, m.placement_size) for m in gpu.mig_devices)


def test_guide_geometry_3g_3g() -> None:
    assert placements("sim:1xa100-40gb/mig=3g.20gb*2") == [("3g.20gb", 0, 4), ("3g.20gb", 4, 4)]


def test_guide_geometry_3_2_1_1() -> None:
    # Guide: 3g at 4:4, 2g at 2:2, 1g at 0:1 and 1:1 (lowest-start-first would refuse it).
    assert placements("sim:1xa100-40gb/mig=1g.5gb*2+2g.10gb+3g.20gb") == [
        ("1g.5gb", 0, 1),
        ("1g.5gb", 1, 1),
        ("2g.10gb", 2, 2),
        ("3g.20gb", 4, 4),
    ]


def test_guide_geometry_2_1_1_1_1_1() -> None:
    assert placements("sim:1xa100-40gb/mig=2g.10gb*1+1g.5gb*5") == [
        ("1g.5gb", 0, 1),
        ("1g.5gb", 1, 1),
        ("1g.5gb", 2, 1),
        ("1g.5gb", 3, 1),
        ("1g.5gb", 6, 1),
        ("2g.10gb", 4, 2),
    ]


def test_guide_geometry_4g_2g_1g() -> None:
    assert placements("sim:1xh100-80gb/mig=4g.40gb+2g.20gb+1g.10gb") == [
        ("1g.10gb", 6, 1),
        ("2g.20gb", 4, 2),
        ("4g.40gb", 0, 4),
    ]


def test_4g_plus_3g_fits_on_r510_and_later() -> None:
    assert placements("sim:1xa100-40gb/mig=4g.20gb+3g.20gb") == [
        ("3g.20gb", 4, 4),
        ("4g.20gb", 0, 4),
    ]


def test_mig_parted_balanced_layouts_fit() -> None:
    assert len(placements("sim:1xa100-40gb/mig=1g.5gb*2+2g.10gb+3g.20gb")) == 4
    assert len(placements("sim:1xa100-80gb/mig=1g.10gb*2+2g.20gb+3g.40gb")) == 4
    assert len(placements("sim:1xh200/mig=1g.18gb*2+2g.35gb+3g.71gb")) == 4
    assert len(placements("sim:1xa30/mig=1g.6gb*2+2g.12gb")) == 3


def test_me_profile_engines_and_slice_seven() -> None:
    gpu = inventory("sim:1xa100-40gb/mig=1g.5gb+me+1g.10gb*3").gpus[0]
    me = [m for m in gpu.mig_devices if m.profile == "1g.5gb+me"]
    assert len(me) == 1
    assert (me[0].engines_jpeg, me[0].engines_ofa) == (1, 1)
    wide = [m for m in gpu.mig_devices if m.profile == "1g.10gb"]
    # The 2-slice 1g profile is the only small one that can use memory slice 7 (start 6).
    assert 6 in {m.placement_start for m in wide}


@pytest.mark.parametrize("key", sorted(MAX_COUNTS))
def test_profile_names_follow_from_memory(key: str) -> None:
    """The NVML backend's naming rule reproduces every table name from slices and memory."""
    model = MODELS[key]
    assert model.mig is not None
    for p in model.mig.profiles:
        name = mig_profile_name(
            gi_slices=p.compute_slices,
            ci_slices=p.compute_slices,
            instance_mib=p.memory_mib,
            gpu_mib=model.memory_mib,
            suffix="+me" if p.name.endswith("+me") else "",
        )
        assert name == p.name


def test_sub_compute_instance_names() -> None:
    assert mig_profile_name(gi_slices=3, ci_slices=1, instance_mib=20096, gpu_mib=40960) == (
        "1c.3g.20gb"
    )


@pytest.mark.parametrize("key", sorted(MAX_COUNTS))
def test_instances_fit_in_the_gpu(key: str) -> None:
    model = MODELS[key]
    assert model.mig is not None
    for p in model.mig.profiles:
        assert p.memory_mib * (model.mig.memory_slices // p.memory_slices) <= model.memory_mib
        assert p.multiprocessors <= model.multiprocessors
        assert all(s + p.memory_slices <= model.mig.memory_slices for s in p.starts)
