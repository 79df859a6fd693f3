"""A container with several GPUs (a claim of count 2, two claims, a claim with two requests)
and a MIG device, checked as the runtime applies the CDI specs (`testing.cdirun`): every
GPU it was given is visible, none it was not, and a MIG device brings its capability nodes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.nvml import read_cap_minors, read_caps_major
from gpuslice.core.cdi.spec import TOOLKIT_DEVICE_LIST, CdiDevice
from gpuslice.core.dra.cdispec import cdi_id, claim_spec
from gpuslice.core.dra.claims import ClaimError, ClaimWork, claim_work
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.preparation import preparation
from gpuslice.core.dra.publish import DraDevice, dra_devices
from gpuslice.core.migcaps import access_files, char_major, device_file_minor, numbered_minors
from gpuslice.testing.cdirun import inject

A = "4f1c8a2e-0000-4000-8000-00000000000a"
B = "4f1c8a2e-0000-4000-8000-00000000000b"
GPU_NODES = {"/dev/nvidia0", "/dev/nvidia1"}


def _gpus(container: Any) -> set[str]:
    return {p for p in container.device_nodes if p.removeprefix("/dev/nvidia").isdigit()}


def test_a_claim_of_count_two_shows_both_gpus() -> None:
    devices = [CdiDevice("gpu-0", "GPU-a", 0, request="gpu"),
               CdiDevice("gpu-1", "GPU-b", 1, request="gpu")]  # fmt: skip
    spec = claim_spec(A, devices)
    for order in (["gpu-0", "gpu-1"], ["gpu-1", "gpu-0"]):
        seen = inject([spec], [cdi_id(A, d) for d in order])
        assert set(seen.env["NVIDIA_VISIBLE_DEVICES"].split(",")) == {"GPU-a", "GPU-b"}
        assert _gpus(seen) == GPU_NODES
        assert sorted(seen.mounted_under(TOOLKIT_DEVICE_LIST)) == ["GPU-a", "GPU-b"]


def test_two_claims_in_one_container_give_it_both_gpus() -> None:
    """As with NVIDIA's driver, the device nodes add up over claims (its spec sets
    NVIDIA_VISIBLE_DEVICES=void); so does the toolkit's device list in mounts. The env
    cannot add up: it names the last claim's GPU, never one the container lacks."""
    first = claim_spec(A, [CdiDevice("gpu-0", "GPU-a", 0, request="gpu")])
    second = claim_spec(B, [CdiDevice("gpu-1", "GPU-b", 1, request="gpu")])
    seen = inject([first, second], [cdi_id(A, "gpu-0"), cdi_id(B, "gpu-1")])
    assert _gpus(seen) == GPU_NODES
    assert sorted(seen.mounted_under(TOOLKIT_DEVICE_LIST)) == ["GPU-a", "GPU-b"]
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"


def test_a_container_given_one_request_sees_only_that_requests_gpu() -> None:
    devices = [CdiDevice("gpu-0", "GPU-a", 0, request="a"),
               CdiDevice("gpu-1", "GPU-b", 1, request="b")]  # fmt: skip
    spec = claim_spec(A, devices)
    seen = inject([spec], [cdi_id(A, "gpu-0")])
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert _gpus(seen) == {"/dev/nvidia0"}
    assert seen.mounted_under(TOOLKIT_DEVICE_LIST) == ["GPU-a"]
    whole = inject([spec], [cdi_id(A, "gpu-0"), cdi_id(A, "gpu-1")])
    assert _gpus(whole) == GPU_NODES
    assert sorted(whole.mounted_under(TOOLKIT_DEVICE_LIST)) == ["GPU-a", "GPU-b"]


def _mig_claim() -> tuple[ClaimWork, DraDevice]:
    """A claim of one MIG device (not GI 0, so the numbering is not trivially right)."""
    backend = open_backend("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    devices = {d.name: d for d in dra_devices(inventory)}
    name = next(n for n, d in devices.items() if d.mig is not None and d.mig.gi_id != 0)
    claim = {
        "metadata": {"uid": A},
        "status": {"allocation": {"devices": {"results": [
            {"request": "mig", "driver": "gpu.nvidia.com", "pool": "n1", "device": name}]}}},
    }  # fmt: skip
    work = claim_work(claim, ClaimRef("ns", A, "c"), driver="gpu.nvidia.com", pool="n1",
                      devices=devices, offers={})  # fmt: skip
    return work, devices[name]


def test_a_mig_device_brings_its_gi_and_ci_capability_nodes_under_the_dev_root() -> None:
    work, device = _mig_claim()
    assert device.mig is not None
    gi, ci = numbered_minors(device.gpu.minor, device.mig.gi_id, device.mig.ci_id)
    (cdi,) = preparation(work, "/plug/mps").cdi
    spec = claim_spec(A, [cdi], host_dev_root="/run/nvidia/driver")
    seen = inject([spec], [cdi_id(A, device.name)])
    root = "/run/nvidia/driver"
    for path in (f"/dev/nvidia{device.gpu.minor}", f"/dev/nvidia-caps/nvidia-cap{gi}",
                 f"/dev/nvidia-caps/nvidia-cap{ci}"):  # fmt: skip
        assert seen.device_nodes[path] == {"path": path, "hostPath": f"{root}{path}"}
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == device.uuid


def test_a_mig_device_whose_capability_minors_are_unknown_is_refused() -> None:
    work, device = _mig_claim()
    assert device.mig is not None
    blind = replace(
        work.devices[0], device=replace(device, mig=replace(device.mig, cap_minors=None))
    )
    work = replace(work, devices=(blind,), groups=(replace(work.groups[0], devices=(blind,)),))
    with pytest.raises(ClaimError, match="capability minors could not be read"):
        preparation(work, "/plug/mps")


def test_the_drivers_numbering_matches_its_mig_minors_file() -> None:
    # lines of /proc/driver/nvidia-caps/mig-minors, as NVIDIA's nvcaps.go quotes them
    assert numbered_minors(0, 0, 0) == (3, 4)
    assert numbered_minors(0, 0, 2)[1] == 6
    assert numbered_minors(3, 3, 3)[1] == 439
    assert numbered_minors(6, 11, 7)[1] == 920


def test_the_minors_are_read_from_the_access_files(tmp_path: Path) -> None:
    gi, ci = access_files(1, 7, 0)
    assert (gi, ci) == ("/proc/driver/nvidia/capabilities/gpu1/mig/gi7/access",
                        "/proc/driver/nvidia/capabilities/gpu1/mig/gi7/ci0/access")  # fmt: skip
    for path, minor in ((gi, 201), (ci, 202)):
        file = tmp_path / path.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    assert read_cap_minors(1, 7, 0, root=tmp_path) == (201, 202)
    assert read_cap_minors(1, 8, 0, root=tmp_path) is None
    with pytest.raises(ValueError, match="DeviceFileMinor"):
        device_file_minor("DeviceFileMode: 292\n")


PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
234 nvidia-caps
509 nvidia-uvm

Block devices:
  8 sd
235 nvidia-caps
"""


def test_with_the_caps_major_the_runtime_creates_the_nodes_as_nvidias_spec_has_it(
    tmp_path: Path,
) -> None:
    """NVIDIA gives the capability nodes by number (type c, major, minor), so the host
    needs no /dev/nvidia-caps/nvidia-cap<N>; the GPU's own node still follows the dev root."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text(PROC_DEVICES)
    major = read_caps_major(tmp_path)
    assert major == 234  # the character device, not the block device of the same name
    assert read_caps_major(tmp_path / "nowhere") is None
    assert char_major("Character devices:\n  1 mem\n") is None
    device = CdiDevice("gpu-0-mig-1g10gb-19-0", "MIG-a", 0, mig_caps=(129, 130), caps_major=major)
    spec = claim_spec(A, [device], host_dev_root="/run/nvidia/driver")
    seen = inject([spec], [cdi_id(A, device.device)])
    path = "/dev/nvidia-caps/nvidia-cap129"
    assert seen.device_nodes[path] == {"path": path, "type": "c", "major": 234, "minor": 129}
    assert seen.device_nodes["/dev/nvidia-caps/nvidia-cap130"]["minor"] == 130
    assert seen.device_nodes["/dev/nvidia0"]["hostPath"] == "/run/nvidia/driver/dev/nvidia0"
