"""The NVML backend on a machine without a GPU, and its pure translation helpers.

The full behaviour runs in the contract suite with `--with-gpu`; here: clean failure without
a driver, no pynvml import at module import, and the mappings NVML values go through.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.nvml import (
    cores_per_sm,
    numa_from_sysfs,
    pci_class_from_sysfs,
    pcie_root_from_sysfs,
    sysfs_bus_id,
    translate_event,
)
from gpuslice.core.health import NO_INSTANCE, HealthEvent
from gpuslice.ports import BackendError


def nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(nvml_loadable(), reason="an NVIDIA driver is installed here")
def test_no_driver_is_a_clear_backend_error() -> None:
    with pytest.raises(BackendError) as err:
        open_backend("nvml")
    message = str(err.value)
    assert message.startswith("NVML not available: ")
    assert "(no NVIDIA driver on this machine?)" in message
    assert "Traceback" not in message


def test_importing_backends_does_not_import_pynvml() -> None:
    code = (
        "import sys, gpuslice.backends, gpuslice.backends.nvml; "
        "sys.exit(1 if 'pynvml' in sys.modules else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_xid_event() -> None:
    assert translate_event(0x8, 79, NO_INSTANCE, NO_INSTANCE, "GPU-a") == HealthEvent(
        "xid", "GPU-a", xid=79
    )
    assert translate_event(0x8, 94, 3, 0, "GPU-a") == HealthEvent(
        "xid", "GPU-a", xid=94, gi_id=3, ci_id=0
    )


def test_recovery_action_none_is_recovered_other_actions_are_not() -> None:
    assert translate_event(0x8000, 0, NO_INSTANCE, NO_INSTANCE, "GPU-a") == HealthEvent(
        "recovered", "GPU-a"
    )
    assert translate_event(0x8000, 1, NO_INSTANCE, NO_INSTANCE, "GPU-a") is None  # GPU reset


def test_unavailable_is_lost_and_ecc_is_skipped() -> None:
    assert translate_event(0x4000, 0, NO_INSTANCE, NO_INSTANCE, "GPU-a") == HealthEvent(
        "lost", "GPU-a"
    )
    assert translate_event(0x2, 0, NO_INSTANCE, NO_INSTANCE, "GPU-a") is None
    assert translate_event(0x1, 0, NO_INSTANCE, NO_INSTANCE, "GPU-a") is None


@pytest.mark.parametrize(
    ("capability", "cuda_cores", "sms"),
    [
        ((7, 5), 2560, 40),
        ((8, 0), 6912, 108),
        ((8, 6), 3584, 28),
        ((8, 9), 18176, 142),
        ((9, 0), 16896, 132),
    ],
    ids=["t4", "a100", "rtx-3060", "l40s", "h100-sxm"],
)
def test_sm_count_from_cuda_cores(capability: tuple[int, int], cuda_cores: int, sms: int) -> None:
    assert cuda_cores // cores_per_sm(capability) == sms


def test_bus_id_forms() -> None:
    assert sysfs_bus_id("00000000:07:00.0") == "0000:07:00.0"
    assert sysfs_bus_id("00000001:B7:00.0") == "0001:b7:00.0"


def test_numa_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "bus/pci/devices/0000:87:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    assert numa_from_sysfs(tmp_path, "00000000:87:00.0") == 1
    (dev / "numa_node").write_text("-1\n")  # no NUMA information
    assert numa_from_sysfs(tmp_path, "00000000:87:00.0") is None
    assert numa_from_sysfs(tmp_path, "00000000:07:00.0") is None


def test_pcie_root_from_sysfs_is_the_first_directory_of_the_devices_path(tmp_path: Path) -> None:
    """As Kubernetes' `GetPCIeRootAttributeByPCIBusID` (NVIDIA's driver) finds it: the
    bus link's target, relative as sysfs writes it, under `devices/pci<domain>:<bus>`."""
    bdf = "0000:65:00.0"
    real = tmp_path / "devices/pci0000:64/0000:64:00.0/0000:65:00.0"
    real.mkdir(parents=True)
    links = tmp_path / "bus/pci/devices"
    links.mkdir(parents=True)
    (links / bdf).symlink_to(f"../../../devices/pci0000:64/0000:64:00.0/{bdf}")
    assert pcie_root_from_sysfs(tmp_path, "00000000:65:00.0") == "pci0000:64"
    absolute = "0001:07:00.0"  # an absolute target, another domain
    (links / absolute).symlink_to(tmp_path / f"devices/pci0001:00/0001:00:01.0/{absolute}")
    assert pcie_root_from_sysfs(tmp_path, "00000001:07:00.0") == "pci0001:00"


def test_no_pcie_root_where_sysfs_does_not_show_one(tmp_path: Path) -> None:
    """Missing link, a directory instead of a link, a target outside `devices/pci...`, or
    one that ends in another device: the attribute is left out, never guessed."""
    links = tmp_path / "bus/pci/devices"
    links.mkdir(parents=True)
    assert pcie_root_from_sysfs(tmp_path, "00000000:07:00.0") is None
    (links / "0000:07:00.0").mkdir()
    assert pcie_root_from_sysfs(tmp_path, "00000000:07:00.0") is None
    (links / "0000:08:00.0").symlink_to("../../../devices/platform/0000:08:00.0")
    assert pcie_root_from_sysfs(tmp_path, "00000000:08:00.0") is None
    (links / "0000:09:00.0").symlink_to("../../../devices/pci0000:00/0000:0a:00.0")
    assert pcie_root_from_sysfs(tmp_path, "00000000:09:00.0") is None
    assert pcie_root_from_sysfs(tmp_path, "not-a-bus-id") is None


def test_pci_class_from_sysfs(tmp_path: Path) -> None:
    """GFD reads the class from sysfs (go-nvlib nvpci); NVML does not report it."""
    device = tmp_path / "bus/pci/devices/0000:07:00.0"
    device.mkdir(parents=True)
    (device / "class").write_text("0x030000\n")
    assert pci_class_from_sysfs(tmp_path, "00000000:07:00.0") == 0x030000
    (device / "class").write_text("garbage\n")
    assert pci_class_from_sysfs(tmp_path, "00000000:07:00.0") is None
    assert pci_class_from_sysfs(tmp_path, "00000000:08:00.0") is None


def test_mig_config_change_event_asks_for_a_re_plan() -> None:
    """nvmlEventMigConfigChange (0x100) is not a health problem: the agent re-plans."""
    event = translate_event(0x100, 0, NO_INSTANCE, NO_INSTANCE, "GPU-1")
    assert event == HealthEvent("inventory-changed", "GPU-1")
