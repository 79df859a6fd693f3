"""GFD labels for the seed documents' nodes, and the GFD rules from REFERENCE §6."""

from __future__ import annotations

import pytest

from gpuslice.core.labels import gfd_labels, gpu_family, sanitise
from gpuslice.core.sharing.model import SharingStrategy
from tests.core.labels.label_fixtures import (
    A100_80,
    L40S,
    T4,
    gpu,
    inventory,
    physical_gpu,
    physical_mig,
    plan,
    resource,
)

GPU = "nvidia.com/gpu"


def test_seed_002_t4_time_slicing_four_replicas() -> None:
    # Seed 002: 4 x Tesla T4, timeSlicing replicas 4, renameByDefault false.
    gpus = [gpu(i, T4) for i in range(4)]
    res = resource(
        GPU, [physical_gpu(g) for g in gpus], replicas=4, strategy=SharingStrategy.TIME_SLICING
    )
    labels = gfd_labels(inventory(*gpus), plan(res), timestamp=None, machine_type="x")
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.memory"] == "15360"
    assert labels["nvidia.com/gpu.family"] == "turing"
    assert labels["nvidia.com/mps.capable"] == "false"
    assert "nvidia.com/mig.strategy" not in labels
    assert "nvidia.com/gfd.timestamp" not in labels


def test_seed_002_rename_by_default_keeps_plain_product_under_original_name() -> None:
    gpus = [gpu(i, T4) for i in range(4)]
    res = resource(
        GPU,
        [physical_gpu(g) for g in gpus],
        replicas=4,
        strategy=SharingStrategy.TIME_SLICING,
        name="nvidia.com/gpu.shared",
    )
    labels = gfd_labels(inventory(*gpus), plan(res), timestamp=None, machine_type="x")
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert not any(k.startswith("nvidia.com/gpu.shared.") for k in labels)


def test_seed_001_l40s_mps_ten_replicas() -> None:
    g = gpu(0, L40S)
    res = resource(GPU, [physical_gpu(g)], replicas=10, strategy=SharingStrategy.MPS)
    labels = gfd_labels(inventory(g), plan(res), timestamp=None, machine_type="x")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L40S-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "10"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"


def test_seed_001_l40s_time_slicing_six_is_not_mps_capable() -> None:
    g = gpu(0, L40S)
    res = resource(GPU, [physical_gpu(g)], replicas=6, strategy=SharingStrategy.TIME_SLICING)
    labels = gfd_labels(inventory(g), plan(res), timestamp=None, machine_type="x")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L40S-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "6"
    assert labels["nvidia.com/mps.capable"] == "false"


def test_seed_001_a100_mig_single_seven_1g_10gb() -> None:
    g = gpu(0, A100_80, mig_capable=True, mig_enabled=True, migs=7)
    res = resource(GPU, [physical_mig(g, m) for m in g.mig_devices])
    labels = gfd_labels(
        inventory(g), plan(res, mig_strategy="single"), timestamp=None, machine_type="x"
    )
    assert labels["nvidia.com/gpu.count"] == "7"
    assert labels["nvidia.com/gpu.memory"] == "9728"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.multiprocessors"] == "14"
    assert labels["nvidia.com/gpu.slices.gi"] == "1"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["nvidia.com/mps.capable"] == "false"


def test_seed_001_a100_mps_ten_replicas() -> None:
    g = gpu(0, A100_80, mig_capable=True)
    res = resource(GPU, [physical_gpu(g)], replicas=10, strategy=SharingStrategy.MPS)
    labels = gfd_labels(inventory(g), plan(res), timestamp=None, machine_type="x")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-SHARED"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/mig.capable"] == "true"


def test_mixed_strategy_labels_each_profile_by_its_resource_name() -> None:
    # Seed 002's a100-40gb config: mixed, time-slicing 2 on mig-1g.5gb.
    g = gpu(
        0,
        ("NVIDIA A100-SXM4-40GB", 40960, 108, (8, 0)),
        mig_capable=True,
        mig_enabled=True,
        migs=3,
        profile="1g.5gb",
        mig_mib=4864,
    )
    mig_res = resource(
        "nvidia.com/mig-1g.5gb",
        [physical_mig(g, m) for m in g.mig_devices],
        replicas=2,
        strategy=SharingStrategy.TIME_SLICING,
    )
    labels = gfd_labels(
        inventory(g), plan(mig_res, mig_strategy="mixed"), timestamp=None, machine_type="x"
    )
    prefix = "nvidia.com/mig-1g.5gb."
    assert labels[prefix + "count"] == "3"
    assert labels[prefix + "product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert labels[prefix + "replicas"] == "2"
    assert labels[prefix + "sharing-strategy"] == "time-slicing"
    assert labels[prefix + "memory"] == "4864"
    assert labels[prefix + "engines.copy"] == "1"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    # Every GPU is in MIG mode: nvidia.com/gpu describes the parent with replicas 0.
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "1"


def test_mig_profile_with_attributes_uses_dots() -> None:
    g = gpu(0, A100_80, mig_capable=True, mig_enabled=True, migs=1, profile="1g.10gb+me")
    res = resource("nvidia.com/mig-1g.10gb.me", [physical_mig(g, g.mig_devices[0])])
    labels = gfd_labels(
        inventory(g), plan(res, mig_strategy="mixed"), timestamp=None, machine_type=""
    )
    assert labels["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb.me"


def test_single_strategy_with_two_profiles_is_invalid() -> None:
    a = gpu(0, A100_80, mig_capable=True, mig_enabled=True, migs=2)
    b = gpu(1, A100_80, mig_capable=True, mig_enabled=True, migs=1, profile="3g.40gb")
    res = resource(GPU, [physical_mig(a, m) for m in a.mig_devices])
    labels = gfd_labels(
        inventory(a, b), plan(res, mig_strategy="single"), timestamp=None, machine_type=""
    )
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-MIG-INVALID"
    assert labels["nvidia.com/gpu.count"] == "0"
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.memory"] == "0"
    assert labels["nvidia.com/gpu.sharing-strategy"] == ""
    assert "nvidia.com/gpu.multiprocessors" not in labels


def test_single_strategy_with_one_gpu_out_of_mig_mode_is_invalid() -> None:
    a = gpu(0, A100_80, mig_capable=True, mig_enabled=True, migs=7)
    b = gpu(1, A100_80, mig_capable=True)
    labels = gfd_labels(
        inventory(a, b), plan(mig_strategy="single"), timestamp=None, machine_type=""
    )
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-MIG-INVALID"


def test_single_strategy_without_mig_labels_whole_gpus() -> None:
    a = gpu(0, A100_80, mig_capable=True)
    res = resource(GPU, [physical_gpu(a)])
    labels = gfd_labels(
        inventory(a), plan(res, mig_strategy="single"), timestamp=None, machine_type=""
    )
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe"
    assert labels["nvidia.com/gpu.memory"] == "81920"


def test_driver_runtime_machine_and_timestamp() -> None:
    g = gpu(0, T4)
    res = resource(GPU, [physical_gpu(g)])
    inv = inventory(g, driver="550.107.02", cuda=12050)
    labels = gfd_labels(inv, plan(res), timestamp=1724632719, machine_type="NVIDIA DGX-2H")
    expected = {
        "nvidia.com/gfd.timestamp": "1724632719",
        "nvidia.com/gpu.machine": "NVIDIA-DGX-2H",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "107",
        "nvidia.com/cuda.driver.rev": "02",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "107",
        "nvidia.com/cuda.driver-version.revision": "02",
        "nvidia.com/cuda.driver-version.full": "550.107.02",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "5",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "5",
        "nvidia.com/cuda.runtime-version.full": "12.5",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.capable": "false",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.compute.major": "7",
        "nvidia.com/gpu.compute.minor": "5",
    }
    assert {k: labels[k] for k in expected} == expected


def test_unknown_machine_type() -> None:
    g = gpu(0, T4)
    labels = gfd_labels(
        inventory(g), plan(resource(GPU, [physical_gpu(g)])), timestamp=None, machine_type="  "
    )
    assert labels["nvidia.com/gpu.machine"] == "unknown"


def test_per_gpu_replicas_label_uses_the_maximum() -> None:
    # Per-GPU sharing (gpuslice extension): GPU 0 shared 2 ways, GPU 1 shared 8 ways.
    a, b = gpu(0, T4), gpu(1, T4)
    res = resource(
        GPU,
        [physical_gpu(a), physical_gpu(b)],
        replicas=[2, 8],
        strategy=SharingStrategy.TIME_SLICING,
    )
    labels = gfd_labels(inventory(a, b), plan(res), timestamp=None, machine_type="")
    assert labels["nvidia.com/gpu.replicas"] == "8"
    assert labels["nvidia.com/gpu.count"] == "2"


def test_per_gpu_dedicated_and_renamed_shared_share_one_label_name() -> None:
    # GPU 0 stays whole as nvidia.com/gpu; GPU 1 is shared 4 ways as nvidia.com/gpu.shared.
    a, b = gpu(0, T4), gpu(1, T4)
    whole = resource(GPU, [physical_gpu(a)])
    shared = resource(
        GPU,
        [physical_gpu(b)],
        replicas=4,
        strategy=SharingStrategy.TIME_SLICING,
        name="nvidia.com/gpu.shared",
    )
    labels = gfd_labels(inventory(a, b), plan(whole, shared), timestamp=None, machine_type="")
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"  # the shared one is renamed


def test_no_gpus_no_labels() -> None:
    assert gfd_labels(inventory(), plan(), timestamp=1, machine_type="x") == {}


def test_sanitise() -> None:
    assert sanitise("NVIDIA A100 80GB PCIe") == "NVIDIA-A100-80GB-PCIe"
    assert sanitise("Quadro RTX 6000/8000 (rev a1)") == "Quadro-RTX-60008000-rev-a1"
    assert sanitise("a  \t b") == "a-b"


def test_family_table() -> None:
    table = {
        (3, 7): "kepler",
        (6, 1): "pascal",
        (7, 0): "volta",
        (7, 2): "volta",
        (7, 5): "turing",
        (8, 0): "ampere",
        (8, 6): "ampere",
        (8, 9): "ada-lovelace",
        (9, 0): "hopper",
        (10, 0): "blackwell",
        (12, 0): "blackwell",
        (13, 0): "rubin",
        (11, 0): "undefined",
    }
    assert {cc: gpu_family(cc) for cc in table} == table


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("ThinkSystem SR670 V2 -[7Z22CTO1WW]-", "ThinkSystem-SR670-V2--7Z22CTO1WW"),
        ("PowerEdge XE9680", "PowerEdge-XE9680"),
        ("-.-", "unknown"),
        ("X" * 40 + " " + "Y" * 40, "X" * 40 + "-" + "Y" * 22),
    ],
)
def test_the_machine_label_is_a_valid_label_value(machine: str, expected: str) -> None:
    """A value the API server refuses (over 63 characters, or not alphanumeric at an end)
    fails the whole label apply: kube-apiserver 1.36 refused Lenovo's `-[MTM]-` names."""
    labels = gfd_labels(inventory(gpu(0, T4)), plan(), timestamp=None, machine_type=machine)
    assert labels["nvidia.com/gpu.machine"] == expected
