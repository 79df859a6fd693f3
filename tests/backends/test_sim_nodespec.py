"""Simulated node specs and YAML node files: what they build, and how they refuse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.backends.simulated.layout import place
from gpuslice.backends.simulated.models import GpuModel, MigGeometry, MigProfile
from gpuslice.core.devices import Inventory
from gpuslice.ports import BackendError


def inventory(spec: str) -> Inventory:
    backend = open_backend(spec)
    try:
        return backend.inventory()
    finally:
        backend.close()


def test_groups_in_order_with_global_indices() -> None:
    inv = inventory("sim:1xt4,2xl40s")
    assert [(g.index, g.product_name) for g in inv.gpus] == [
        (0, "Tesla T4"),
        (1, "NVIDIA L40S"),
        (2, "NVIDIA L40S"),
    ]
    assert [g.minor for g in inv.gpus] == [0, 1, 2]
    assert inv.driver_version == "550.54.15"
    assert inv.cuda_driver_version == 12040


def test_count_defaults_to_one_and_model_is_case_insensitive() -> None:
    assert [g.product_name for g in inventory("sim:T4").gpus] == ["Tesla T4"]


def test_uuids_are_stable_and_formatted_like_nvml() -> None:
    first, second = inventory("sim:2xt4"), inventory("sim:2xt4")
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    assert first.gpus[0].uuid != first.gpus[1].uuid
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", first.gpus[0].uuid)
    mig = inventory("sim:1xa100-80gb/mig=1g.10gb*7")
    assert len({m.uuid for m in mig.mig_devices()}) == 7
    assert all(m.uuid.startswith("MIG-") for m in mig.mig_devices())


def test_pci_bus_ids_are_distinct_nvml_form() -> None:
    inv = inventory("sim:16xt4")
    ids = [g.pci_bus_id for g in inv.gpus]
    assert len(set(ids)) == 16
    assert all(re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", i) for i in ids)


def test_numa_split_only_above_four_gpus() -> None:
    assert [g.numa_node for g in inventory("sim:4xt4").gpus] == [0, 0, 0, 0]
    assert [g.numa_node for g in inventory("sim:8xl40s").gpus] == [0] * 4 + [1] * 4


def test_pcie_links_follow_numa() -> None:
    inv = inventory("sim:8xl40s")
    g = inv.gpus
    near, far = inv.link(g[0].uuid, g[1].uuid), inv.link(g[0].uuid, g[7].uuid)
    assert near is not None
    assert (near.p2p, near.nvlinks) == ("same-cpu", 0)
    assert far is not None
    assert (far.p2p, far.nvlinks) == ("cross-cpu", 0)
    assert len(inv.links) == 28


@pytest.mark.parametrize(
    ("spec", "links"),
    [("sim:8xa100-40gb", 12), ("sim:8xh100-80gb", 18), ("sim:8xh200", 18), ("sim:4xa100-40gb", 4)],
)
def test_sxm_boards_have_nvlink_between_all_pairs(spec: str, links: int) -> None:
    inv = inventory(spec)
    assert {link.nvlinks for link in inv.links} == {links}


def test_pcie_a100_has_no_nvlink() -> None:
    assert {link.nvlinks for link in inventory("sim:8xa100-80gb").links} == {0}


def test_mig_layout_applies_to_its_group_only() -> None:
    inv = inventory("sim:1xa100-40gb/mig=7g.40gb,1xa100-40gb")
    assert inv.gpus[0].mig_enabled
    assert inv.gpus[0].mig_pending
    assert [m.profile for m in inv.gpus[0].mig_devices] == ["7g.40gb"]
    assert inv.gpus[0].mig_devices[0].gi_id == 0
    assert not inv.gpus[1].mig_enabled
    assert inv.gpus[1].mig_devices == ()


def test_empty_layout_is_mig_on_without_devices() -> None:
    (gpu,) = inventory("sim:1xa30/mig=").gpus
    assert gpu.mig_enabled
    assert gpu.mig_devices == ()


def test_mig_index_ids() -> None:
    inv = inventory("sim:1xt4,1xa100-40gb/mig=3g.20gb*2")
    assert [m.index_id for m in inv.mig_devices()] == ["1:0", "1:1"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:2xv100", r"unknown GPU model 'v100'; known models: a100-40gb, .*t4"),
        ("sim:2x", r"unknown GPU model '2x'"),
        ("sim:2xt4;1xl40s", r"cannot read '2xt4;1xl40s'.*COUNTxMODEL"),
        ("sim:0xt4", r"count: must be at least 1"),
        ("sim:", r"empty simulated node spec"),
        ("sim:40xt4", r"40 GPUs asked, at most 32"),
        ("cuda", r"unknown backend 'cuda'; use 'nvml', 'sim:COUNTxMODEL"),
        ("sim:1xt4/mig=1g.5gb", r"t4 \(Tesla T4\) does not support MIG; MIG models: a100-40gb"),
        ("sim:1xa100-40gb/mig=1g.10gb*5", r"5x 1g.10gb asked, at most 4 fit"),
        ("sim:1xa100-40gb/mig=2g.20gb", r"has no profile '2g.20gb'; its profiles .*2g\.10gb\*3"),
        ("sim:1xa100-40gb/mig=4g.20gb+2g.10gb*2", r"needs 8 compute slices, the GPU has 7"),
        ("sim:1xa100-40gb/mig=3g.20gb*2+1g.5gb", r"needs 9 memory slices, the GPU has 8"),
        ("sim:1xa30/mig=2g.12gb+me+1g.6gb+me", r"at most one \+me instance"),
        ("sim:1xa100-40gb/mig=1g.5gb*x", r"cannot read '1g.5gb\*x'"),
        ("sim:1xa100-40gb/mig=1g.5gb*0", r"count '0' must be a whole number >= 1"),
    ],
)
def test_bad_specs_say_what_is_accepted(spec: str, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        open_backend(spec)


def test_no_placement_left_names_the_free_slices() -> None:
    # A made-up GPU whose only small profile sits at start 0: two of them cannot coexist.
    profile = MigProfile("1g.1gb", 1, 1, 1024, 14, 2, (0,), 1, 0, 0, 0)
    model = GpuModel(
        "toy", "Toy GPU", 8192, 98, (8, 0), 0, "ampere", mig=MigGeometry(8, 7, (profile,))
    )
    with pytest.raises(BackendError) as err:
        place("1g.1gb*2", model)
    text = str(err.value)
    assert "no free placement for 1g.1gb (placements {0}:1)" in text
    assert "after 1g.1gb@0:1; free memory slices: 1, 2, 3, 4, 5, 6, 7" in text


NODE_FILE = """\
driverVersion: "535.161.08"
cudaDriverVersion: 12020
machineType: DGX A100
controlDir: ctl
gpus:
  - model: a100-40gb
    mig: "3g.20gb*2"
    numa: 1
    uuid: GPU-00000000-1111-2222-3333-444444444444
  - model: a100-40gb
    migEnabled: false
    migPending: true
  - model: t4
    count: 2
processes:
  - pid: 100
    gpu: 0
    mig: 1
    usedMemoryMiB: 2048
  - pid: 200
    gpu: 2
    usedMemoryMiB: 300
    smUtil: 55
    mps: true
"""


def test_node_file(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(NODE_FILE)
    for spec in (str(path), f"sim:{path}"):
        backend = open_backend(spec)
        try:
            assert isinstance(backend, SimulatedBackend)
            assert backend.control_dir == tmp_path / "ctl"
            inv = backend.inventory()
            assert (inv.driver_version, inv.cuda_driver_version) == ("535.161.08", 12020)
            assert inv.machine_type == "DGX A100"
            g0, g1, g2, g3 = inv.gpus
            assert g0.uuid == "GPU-00000000-1111-2222-3333-444444444444"
            assert g0.numa_node == 1
            assert len(g0.mig_devices) == 2
            assert (g1.mig_enabled, g1.mig_pending, g1.mig_devices) == (False, True, ())
            assert g2.product_name == g3.product_name == "Tesla T4"
            procs = {p.pid: p for p in backend.processes()}
            assert procs[100].mig_uuid == g0.mig_devices[1].uuid
            assert procs[100].used_memory_bytes == 2048 * 1024 * 1024
            assert (procs[200].gpu_uuid, procs[200].sm_util_percent) == (g2.uuid, 55)
            assert procs[200].is_mps_client
            used = {s.gpu_uuid: s.memory_used_mib for s in backend.statuses()}
            assert used == {g0.uuid: 2048, g1.uuid: 0, g2.uuid: 300, g3.uuid: 0}
        finally:
            backend.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: []", r"gpus: expected a non-empty list"),
        ("- t4", r"expected a mapping with a `gpus` list"),
        ("gpus: [{count: 2}]", r"gpus\[0\].model: required; one of a100-40gb"),
        ("gpus: [{model: t4, colour: red}]", r"gpus\[0\]: unknown key\(s\) colour; allowed: count"),
        ("gpus: [{model: t4, mig: 1g.5gb}]", r"gpus\[0\]: t4 \(Tesla T4\) does not support MIG"),
        ("gpus: [{model: t4, count: 2, uuid: GPU-1}]", r"uuid: only allowed with count 1"),
        ("gpus: [{model: t4, count: two}]", r"gpus\[0\].count: expected a whole number, got 'two'"),
        ("gpus: [{model: t4}]\nprocesses: [{pid: 1}]", r"processes\[0\]: pid and gpu"),
        ("gpus: [{model: t4}]\nprocesses: [{pid: 1, gpu: 3}]", r"no GPU index 3: .* 0..0"),
        ("gpus: [{model: a30, mig: 1g.6gb}]\nprocesses: [{pid: 1, gpu: 0}]", r"is in MIG mode"),
        ("gpus: [{model: t4}\n", r"cannot read it"),
    ],
)
def test_bad_node_files_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    with pytest.raises(BackendError, match=message):
        open_backend(str(path))


def test_missing_node_file(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"node file .*nope.yaml not found"):
        open_backend(f"sim:{tmp_path}/nope.yaml")
