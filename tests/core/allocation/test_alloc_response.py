"""Allocate responses: every device-list strategy, device specs, MPS, and request checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from gpuslice.core.allocation import ContainerAllocation, DeviceSpec, Mount, build_allocation
from gpuslice.core.errors import AllocationError
from gpuslice.core.sharing.model import AllocateSettings, ResourcePlan, SharingStrategy
from tests.core.allocation.alloc_plans import exclusive, gpu, mig, mig_gpu, shared, whole

G0, G1 = gpu(0), gpu(1)
TS = shared([whole(G0), whole(G1)], 4, fail_over_one=False)
A100 = mig_gpu(
    0, [("1g.5gb", 7, 0, 4864, 14), ("1g.5gb", 8, 0, 4864, 14), ("3g.20gb", 2, 0, 19968, 42)]
)
MIG = exclusive([mig(A100, 0), mig(A100, 1), mig(A100, 2)], name="nvidia.com/mig-1g.5gb")


def alloc(
    resource: ResourcePlan,
    ids: Sequence[str],
    settings: AllocateSettings | None = None,
    *,
    aid: str = "rid",
    dev_nodes: frozenset[str] = frozenset(),
    mig_caps: Mapping[str, tuple[str, ...]] | None = None,
) -> ContainerAllocation:
    return build_allocation(
        resource,
        settings or AllocateSettings(),
        ids,
        annotation_id=aid,
        dev_nodes=dev_nodes,
        mig_caps=mig_caps,
    )


def test_envvar_uuid_lists_each_gpu_once_in_request_order() -> None:
    a = alloc(TS, ["GPU-0001::2", "GPU-0000::0", "GPU-0001::3"])
    assert a.envs == (("NVIDIA_VISIBLE_DEVICES", "GPU-0001,GPU-0000"),)
    assert a.mounts == ()
    assert a.devices == ()
    assert a.annotations == ()
    assert a.cdi_devices == ()


def test_index_strategy_dedupes_replicas_of_one_gpu() -> None:
    a = alloc(TS, ["GPU-0000::1", "GPU-0000::3"], AllocateSettings(device_id_strategy="index"))
    assert a.env("NVIDIA_VISIBLE_DEVICES") == "0"


def test_index_strategy_uses_gpu_colon_mig_for_mig_devices() -> None:
    a = alloc(MIG, ["MIG-0002", "MIG-0000"], AllocateSettings(device_id_strategy="index"))
    assert a.env("NVIDIA_VISIBLE_DEVICES") == "0:2,0:0"
    assert alloc(MIG, ["MIG-0001"]).env("NVIDIA_VISIBLE_DEVICES") == "MIG-0001"


def test_volume_mounts_sets_directory_and_one_null_mount_per_device() -> None:
    a = alloc(
        TS,
        ["GPU-0000::0", "GPU-0001::0"],
        AllocateSettings(device_list_strategies=("volume-mounts",)),
    )
    assert a.env("NVIDIA_VISIBLE_DEVICES") == "/var/run/nvidia-container-devices"
    assert a.mounts == (
        Mount("/var/run/nvidia-container-devices/GPU-0000", "/dev/null", False),
        Mount("/var/run/nvidia-container-devices/GPU-0001", "/dev/null", False),
    )


def test_envvar_with_volume_mounts_ends_with_the_directory_as_nvidia_does() -> None:
    settings = AllocateSettings(device_list_strategies=("envvar", "volume-mounts"))
    a = alloc(TS, ["GPU-0000::0"], settings)
    assert a.env("NVIDIA_VISIBLE_DEVICES") == "/var/run/nvidia-container-devices"
    assert len(a.mounts) == 1


def test_cdi_annotations_key_uses_prefix_plugin_and_injected_id() -> None:
    settings = AllocateSettings(device_list_strategies=("cdi-annotations",))
    a = alloc(TS, ["GPU-0000::0", "GPU-0001::1"], settings, aid="1234")
    assert a.annotations == (
        (
            "cdi.k8s.io/nvidia-device-plugin_1234",
            "k8s.device-plugin.nvidia.com/gpu=GPU-0000,k8s.device-plugin.nvidia.com/gpu=GPU-0001",
        ),
    )
    assert a.envs == ()
    assert a.cdi_devices == ()


def test_cdi_annotations_custom_prefix() -> None:
    settings = AllocateSettings(
        device_list_strategies=("cdi-annotations",), cdi_annotation_prefix="example.com/"
    )
    a = alloc(TS, ["GPU-0000::0"], settings, aid="x")
    assert [k for k, _ in a.annotations] == ["example.com/nvidia-device-plugin_x"]


def test_cdi_cri_uses_cdi_devices_with_index_names() -> None:
    settings = AllocateSettings(device_list_strategies=("cdi-cri",), device_id_strategy="index")
    a = alloc(TS, ["GPU-0001::0", "GPU-0001::2"], settings)
    assert a.cdi_devices == ("k8s.device-plugin.nvidia.com/gpu=1",)
    assert a.envs == ()
    assert a.annotations == ()


def test_both_cdi_forms_and_envvar_combine() -> None:
    settings = AllocateSettings(device_list_strategies=("cdi-annotations", "cdi-cri", "envvar"))
    a = alloc(TS, ["GPU-0000::0"], settings, aid="a")
    name = "k8s.device-plugin.nvidia.com/gpu=GPU-0000"
    assert a.cdi_devices == (name,)
    assert a.annotations == (("cdi.k8s.io/nvidia-device-plugin_a", name),)
    assert a.env("NVIDIA_VISIBLE_DEVICES") == "GPU-0000"


def test_gdrcopy_gds_mofed_add_env_and_cdi_all_devices() -> None:
    settings = AllocateSettings(
        device_list_strategies=("cdi-cri",),
        gdrcopy_enabled=True,
        gds_enabled=True,
        mofed_enabled=True,
    )
    a = alloc(TS, ["GPU-0000::0"], settings)
    assert dict(a.envs) == {
        "NVIDIA_GDRCOPY": "enabled",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
    }
    assert a.cdi_devices == (
        "k8s.device-plugin.nvidia.com/gpu=GPU-0000",
        "k8s.device-plugin.nvidia.com/gdrcopy=all",
        "k8s.device-plugin.nvidia.com/gds=all",
        "k8s.device-plugin.nvidia.com/mofed=all",
    )
    plain = alloc(TS, ["GPU-0000::0"], AllocateSettings(gds_enabled=True))
    assert dict(plain.envs) == {"NVIDIA_GDS": "enabled", "NVIDIA_VISIBLE_DEVICES": "GPU-0000"}


ALL_NODES = frozenset(
    {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
)


def test_device_specs_with_root_slash() -> None:
    a = alloc(
        TS,
        ["GPU-0001::0", "GPU-0000::0"],
        AllocateSettings(pass_device_specs=True),
        dev_nodes=ALL_NODES,
    )
    assert a.devices == (
        DeviceSpec("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        DeviceSpec("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
        DeviceSpec("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools", "rw"),
        DeviceSpec("/dev/nvidia-modeset", "/dev/nvidia-modeset", "rw"),
        DeviceSpec("/dev/nvidia11", "/dev/nvidia11", "rw"),
        DeviceSpec("/dev/nvidia10", "/dev/nvidia10", "rw"),
    )


@pytest.mark.parametrize("root", ["/run/nvidia/driver", "/run/nvidia/driver/"])
def test_device_specs_with_driver_root_prefix_host_paths_only(root: str) -> None:
    settings = AllocateSettings(pass_device_specs=True, nvidia_dev_root=root)
    a = alloc(TS, ["GPU-0000::0"], settings, dev_nodes=frozenset({"/dev/nvidiactl"}))
    assert a.devices == (
        DeviceSpec("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        DeviceSpec("/dev/nvidia10", "/run/nvidia/driver/dev/nvidia10", "rw"),
    )


def test_device_specs_only_for_existing_control_nodes() -> None:
    a = alloc(TS, ["GPU-0000::0"], AllocateSettings(pass_device_specs=True))
    assert [d.container_path for d in a.devices] == ["/dev/nvidia10"]


def test_mig_device_specs_share_the_parent_node_and_add_caps() -> None:
    caps = {
        "MIG-0000": ("/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"),
        "MIG-0001": ("/dev/nvidia-caps/nvidia-cap75", "/dev/nvidia-caps/nvidia-cap76"),
    }
    a = alloc(
        MIG, ["MIG-0000", "MIG-0001"], AllocateSettings(pass_device_specs=True), mig_caps=caps
    )
    assert [d.container_path for d in a.devices] == [
        "/dev/nvidia10",
        "/dev/nvidia-caps/nvidia-cap66",
        "/dev/nvidia-caps/nvidia-cap67",
        "/dev/nvidia-caps/nvidia-cap75",
        "/dev/nvidia-caps/nvidia-cap76",
    ]


def test_all_cdi_strategies_skip_env_and_device_specs() -> None:
    settings = AllocateSettings(device_list_strategies=("cdi-cri",), pass_device_specs=True)
    a = alloc(TS, ["GPU-0000::0"], settings, dev_nodes=ALL_NODES)
    assert a.devices == ()
    assert a.envs == ()


def test_mps_env_and_mounts_with_default_root() -> None:
    res = shared([whole(gpu(0, memory_mib=46068, sms=142))], 10, strategy=SharingStrategy.MPS)
    a = alloc(res, ["GPU-0000::3"])
    assert dict(a.envs) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4606M",
        "NVIDIA_VISIBLE_DEVICES": "GPU-0000",
    }
    assert a.mounts == (
        Mount("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe", False),
        Mount("/dev/shm", "/run/nvidia/mps/shm", False),
    )


def test_mps_custom_root_renamed_resource_and_two_gpus() -> None:
    res = shared(
        [whole(gpu(0)), whole(gpu(1, memory_mib=24576))],
        3,
        name="nvidia.com/gpu.shared",
        strategy=SharingStrategy.MPS,
        fail_over_one=False,
    )
    a = alloc(
        res, ["GPU-0001::0", "GPU-0000::1", "GPU-0001::2"], AllocateSettings(mps_root="/var/mps/")
    )
    assert a.env("CUDA_MPS_PIPE_DIRECTORY") == "/mps/nvidia.com/gpu.shared/pipe"
    assert a.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "33"
    # container ordinal 0 is GPU 1 (listed first), 24576 // 3 = 8192; ordinal 1: 15360 // 3
    assert a.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=8192M,1=5120M"
    assert a.mounts[0].host_path == "/var/mps/nvidia.com/gpu.shared/pipe"
    assert a.mounts[1] == Mount("/dev/shm", "/var/mps/shm", False)


def test_time_slicing_has_no_mps_settings() -> None:
    names = {k for k, _ in alloc(TS, ["GPU-0000::0"]).envs}
    assert not any(n.startswith("CUDA_MPS") for n in names)


def test_unknown_device_error_text() -> None:
    with pytest.raises(AllocationError) as err:
        alloc(TS, ["GPU-0000::0", "GPU-9999::0"])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: '
        "unknown device: GPU-9999::0"
    )


def test_more_than_one_shared_device_keeps_nvidia_text_and_adds_a_hint() -> None:
    res = shared([whole(G0)], 4, name="nvidia.com/gpu.shared")
    with pytest.raises(AllocationError) as err:
        alloc(res, ["GPU-0000::0", "GPU-0000::1"])
    text = str(err.value)
    nvidia = (
        'invalid allocation request for "nvidia.com/gpu.shared": invalid request: '
        "maximum request size for shared resources is 1; found 2"
    )
    assert text.startswith(nvidia + ". ")
    hint = text.removeprefix(nvidia + ". ")
    assert "nvidia.com/gpu.shared: 1" in hint
    assert "failRequestsGreaterThanOne: false" in hint
    assert "whole-GPU" in hint


def test_more_than_one_allowed_when_flag_is_off_or_devices_are_whole() -> None:
    assert alloc(TS, ["GPU-0000::0", "GPU-0000::1"]).env("NVIDIA_VISIBLE_DEVICES") == "GPU-0000"
    whole_gpus = exclusive([whole(G0), whole(G1)])
    assert (
        alloc(whole_gpus, ["GPU-0000", "GPU-0001"]).env("NVIDIA_VISIBLE_DEVICES")
        == "GPU-0000,GPU-0001"
    )


def test_unknown_id_is_reported_before_size() -> None:
    res = shared([whole(G0)], 4)
    with pytest.raises(AllocationError, match="unknown device: nope"):
        alloc(res, ["GPU-0000::0", "nope"])


def test_repeated_id_is_granted_once_like_nvidia_server_allocate() -> None:
    """NVIDIA `internal/plugin/server.go` (TestAllocate, "Deduplicate requested device IDs"):
    a repeated ID is de-duplicated and granted, not refused."""
    granted = alloc(TS, ["GPU-0000::1", "GPU-0000::1", "GPU-0001::0"])
    assert granted.env("NVIDIA_VISIBLE_DEVICES") == "GPU-0000,GPU-0001"


def test_empty_request_is_rejected() -> None:
    with pytest.raises(AllocationError, match="no devices requested"):
        alloc(TS, [])


def test_same_inputs_give_equal_responses() -> None:
    settings = AllocateSettings(
        device_list_strategies=("envvar", "cdi-annotations"), pass_device_specs=True
    )
    first = alloc(TS, ["GPU-0000::0", "GPU-0001::1"], settings, aid="k", dev_nodes=ALL_NODES)
    again = alloc(TS, ["GPU-0000::0", "GPU-0001::1"], settings, aid="k", dev_nodes=ALL_NODES)
    assert first == again
    assert hash(first) == hash(again)


def test_imex_channel_reaches_the_container_like_nvidia_server_go() -> None:
    """NVIDIA `internal/plugin/server.go` (getAllocateResponse) with `internal/imex/imex.go`:
    a present channel adds NVIDIA_IMEX_CHANNELS (envvar), an `imex/<id>` mount
    (volume-mounts), the `imex-channel=<id>` CDI device, and its device spec."""
    settings = AllocateSettings(imex_channels=(0,), pass_device_specs=True)
    a = alloc(TS, ["GPU-0000::0"], settings)
    assert a.env("NVIDIA_IMEX_CHANNELS") == "0"
    assert (
        DeviceSpec(
            container_path="/dev/nvidia-caps-imex-channels/channel0",
            host_path="/dev/nvidia-caps-imex-channels/channel0",
            permissions="rw",
        )
        in a.devices
    )
    mounts = alloc(
        TS,
        ["GPU-0000::0"],
        AllocateSettings(imex_channels=(0,), device_list_strategies=("volume-mounts",)),
    )
    assert (
        Mount(
            container_path="/var/run/nvidia-container-devices/imex/0",
            host_path="/dev/null",
            read_only=False,
        )
        in mounts.mounts
    )
    cdi = alloc(
        TS,
        ["GPU-0000::0"],
        AllocateSettings(imex_channels=(0,), device_list_strategies=("cdi-cri",)),
    )
    assert "k8s.device-plugin.nvidia.com/imex-channel=0" in cdi.cdi_devices
    assert alloc(TS, ["GPU-0000::0"]).env("NVIDIA_IMEX_CHANNELS") is None
