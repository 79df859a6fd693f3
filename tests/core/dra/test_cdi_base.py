"""The node's base CDI spec (`core.cdi.driver`, found by `host.driverfiles`): the driver's
files once per container and `NVIDIA_VISIBLE_DEVICES=void`, so a container's claims add up
(NVIDIA's bats test "pod with two ResourceClaimTemplates gets two distinct GPUs")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.core.cdi.driver import BASE_ID, DriverFiles, base_spec
from gpuslice.core.cdi.spec import TOOLKIT_DEVICE_LIST, CdiDevice
from gpuslice.core.dra.cdispec import cdi_id, claim_spec
from gpuslice.host.driverfiles import find_driver_files
from gpuslice.testing.cdirun import inject
from gpuslice.testing.driverroot import LIB_DIR, fake_driver_root

V = "550.54.15"
A = "4f1c8a2e-0000-4000-8000-00000000000a"
B = "4f1c8a2e-0000-4000-8000-00000000000b"
HOOK = "/usr/bin/nvidia-cdi-hook"


@pytest.fixture
def files(tmp_path: Path) -> DriverFiles:
    root = fake_driver_root(tmp_path / "drv", V)
    return find_driver_files(str(root), V, str(root))


def test_the_adapter_finds_the_drivers_files_of_its_version_and_nothing_else(
    files: DriverFiles,
) -> None:
    assert files.libraries == (
        f"{LIB_DIR}/libcuda.so.{V}",
        f"{LIB_DIR}/libnvidia-ml.so.{V}",
        f"{LIB_DIR}/libnvidia-nvvm70.so.4",
        f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.{V}",
    )
    assert sorted(files.links) == [
        ("libcuda.so.1", f"{LIB_DIR}/libcuda.so"),
        (f"libcuda.so.{V}", f"{LIB_DIR}/libcuda.so.1"),
        (f"libnvidia-ml.so.{V}", f"{LIB_DIR}/libnvidia-ml.so.1"),
    ]
    assert files.binaries == ("usr/bin/nvidia-smi", "usr/bin/nvidia-cuda-mps-control")
    assert files.firmware == (f"lib/firmware/nvidia/{V}/gsp_ga10x.bin",)
    assert files.sockets == ("run/nvidia-persistenced/socket",)
    assert files.control_nodes == ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
    assert files.missing() == ""


def test_an_empty_driver_root_misses_libcuda_and_nvidiactl(tmp_path: Path) -> None:
    files = find_driver_files(str(tmp_path / "nothing"), V, str(tmp_path / "nothing"))
    assert files.missing() == f"libcuda.so.{V}, /dev/nvidiactl"
    with pytest.raises(ValueError, match="no base spec without"):
        base_spec(files, host_driver_root="/", hook_path=HOOK)


def test_the_base_spec_holds_the_drivers_files_the_hooks_and_void(files: DriverFiles) -> None:
    spec = base_spec(
        files, host_driver_root="/run/nvidia/driver", host_dev_root="/run/nvidia/driver",
        hook_path=HOOK,
    )  # fmt: skip
    assert spec["kind"] == "k8s.gpuslice.io/device"
    assert spec["cdiVersion"] == "0.5.0"  # the device nodes' hostPath
    (device,) = spec["devices"]
    assert f"{spec['kind']}={device['name']}" == BASE_ID
    assert device["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"
    }  # fmt: skip
    common = spec["containerEdits"]
    assert common["env"] == [
        "NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR=/{LIB_DIR}"
    ]  # fmt: skip
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    lib = mounts[f"/{LIB_DIR}/libcuda.so.{V}"]
    assert lib["hostPath"] == f"/run/nvidia/driver/{LIB_DIR}/libcuda.so.{V}"
    assert lib["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert "noexec" in mounts["/run/nvidia-persistenced/socket"]["options"]
    assert {"/usr/bin/nvidia-smi", f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin"} <= set(mounts)
    hooks = {h["args"][1]: h for h in common["hooks"]}
    assert all(h["hookName"] == "createContainer" and h["path"] == HOOK for h in hooks.values())
    assert sorted(hooks) == [
        "create-symlinks", "disable-device-node-modification", "enable-cuda-compat",
        "update-ldcache",
    ]  # fmt: skip
    links = hooks["create-symlinks"]["args"][2:]
    assert links[:2] == ["--link", f"libcuda.so.1::/{LIB_DIR}/libcuda.so"]
    assert f"libnvidia-ml.so.{V}::/{LIB_DIR}/libnvidia-ml.so.1" in links
    assert hooks["enable-cuda-compat"]["args"][2:] == [f"--host-driver-version={V}"]
    assert hooks["update-ldcache"]["args"][2:] == [
        "--folder", f"/{LIB_DIR}", "--folder", f"/{LIB_DIR}/vdpau"
    ]  # fmt: skip


def test_nvidia_ctk_as_the_hook_program_takes_hook_first(files: DriverFiles) -> None:
    spec = base_spec(files, host_driver_root="/", hook_path="/usr/bin/nvidia-ctk")
    for hook in spec["containerEdits"]["hooks"]:
        assert hook["args"][:2] == ["nvidia-ctk", "hook"]


def test_two_claims_in_one_container_see_both_gpus_with_the_base_spec(
    files: DriverFiles,
) -> None:
    """Each device's IDs are the base spec's and its claim's, as NVIDIA's driver returns
    them: the base's edits apply once, the claims' device nodes add up, and no claim names
    its GPU in the environment, so the toolkit's runtime injects nothing of its own."""
    base = base_spec(files, host_driver_root="/", hook_path=HOOK)
    first = claim_spec(A, [CdiDevice("gpu-0", "GPU-a", 0, request="gpu")], driver_from_base=True)
    second = claim_spec(B, [CdiDevice("gpu-1", "GPU-b", 1, request="gpu")], driver_from_base=True)
    seen = inject([base, first, second], [BASE_ID, cdi_id(A, "gpu-0"), BASE_ID, cdi_id(B, "gpu-1")])
    assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"} <= set(seen.device_nodes)
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert seen.mounted_under(TOOLKIT_DEVICE_LIST) == []
    assert len(seen.hooks) == len(base["containerEdits"]["hooks"])  # once, not per claim
    assert sum(m["containerPath"].endswith(f"libcuda.so.{V}") for m in seen.mounts) == 1


def test_without_the_base_spec_a_claim_keeps_naming_its_gpus() -> None:
    spec = claim_spec(A, [CdiDevice("gpu-0", "GPU-a", 0, request="gpu")])
    seen = inject([spec], [cdi_id(A, "gpu-0")])
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert seen.mounted_under(TOOLKIT_DEVICE_LIST) == ["GPU-a"]
