"""What each MPS daemon is told, computed from the plan (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslice.core.mps import daemon_spec, mps_specs, pinned_limit_shown, pipe_dir, shm_dir
from gpuslice.core.sharing.model import AllocateSettings, Plan, SharingStrategy

from .conftest import gpu, shared


def test_l40s_ten_replicas_matches_nvidia_issue_764() -> None:
    plan = Plan(resources=(shared([gpu(0)], 10),))
    (spec,) = mps_specs(plan)
    assert spec.commands == (
        "set_default_device_pinned_mem_limit 0 4606M",
        "set_default_active_thread_percentage 10",
    )


def test_default_root_and_paths() -> None:
    (spec,) = mps_specs(Plan(resources=(shared([gpu(0)], 10),)))
    assert spec.root == "/run/nvidia/mps"
    assert spec.pipe_dir == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert spec.log_dir == "/run/nvidia/mps/nvidia.com/gpu/log"
    assert spec.shm_dir == "/run/nvidia/mps/shm"
    assert spec.started_marker == "/run/nvidia/mps/nvidia.com/gpu/.started"
    assert spec.ready_marker == "/run/nvidia/mps/.ready"
    # Allocate mounts the same host paths the daemon uses.
    assert pipe_dir("", "nvidia.com/gpu") == spec.pipe_dir
    assert shm_dir("") == spec.shm_dir


def test_configured_root_with_trailing_slash() -> None:
    plan = Plan(
        resources=(shared([gpu(0)], 4, name="nvidia.com/gpu.shared"),),
        allocate=AllocateSettings(mps_root="/var/mps/"),
    )
    (spec,) = mps_specs(plan)
    assert spec.pipe_dir == "/var/mps/nvidia.com/gpu.shared/pipe"
    assert spec.ready_marker == "/var/mps/.ready"


def test_three_replicas_on_two_gpus_uses_indices_and_integer_division() -> None:
    plan = Plan(resources=(shared([gpu(0, 15360), gpu(1, 15360)], 3),))
    (spec,) = mps_specs(plan)
    assert spec.gpu_indices == (0, 1)
    assert spec.gpu_uuids == (gpu(0).gpu_uuid, gpu(1).gpu_uuid)
    assert spec.commands == (
        "set_default_device_pinned_mem_limit 0 5120M",
        "set_default_device_pinned_mem_limit 1 5120M",
        "set_default_active_thread_percentage 33",
    )


def test_without_shares_falls_back_to_nvidia_arithmetic() -> None:
    (spec,) = mps_specs(Plan(resources=(shared([gpu(2)], 10, with_share=False),)))
    assert spec.commands == (
        "set_default_device_pinned_mem_limit 2 4606M",
        "set_default_active_thread_percentage 10",
    )


def test_shares_from_the_plan_win_over_the_arithmetic() -> None:
    res = shared([gpu(0)], 4)
    res = replace(
        res,
        devices=tuple(
            replace(d, mps=replace(d.mps, pinned_memory_limit_mib=8000)) if d.mps else d
            for d in res.devices
        ),
    )
    spec = daemon_spec(res, "")
    assert spec is not None
    assert spec.pinned_mem_limits_mib == ((0, 8000),)
    assert spec.active_thread_percentage == 25


def test_only_mps_resources_get_daemons_and_mig_devices_are_skipped() -> None:
    mig = replace(gpu(1), uuid="MIG-1", kind="mig", index_id="1:0", profile="1g.10gb")
    plan = Plan(
        resources=(
            shared([gpu(0)], 2, name="nvidia.com/gpu", strategy=SharingStrategy.TIME_SLICING),
            shared([gpu(1)], 2, name="nvidia.com/gpu.mps"),
            shared([mig], 2, name="nvidia.com/mig-1g.10gb"),
        )
    )
    specs = mps_specs(plan)
    assert [s.resource for s in specs] == ["nvidia.com/gpu.mps"]


def test_changed_limits_make_a_different_spec() -> None:
    a = daemon_spec(shared([gpu(0)], 10), "")
    b = daemon_spec(shared([gpu(0)], 5), "")
    assert a is not None
    assert b is not None
    assert a != b
    assert a == daemon_spec(shared([gpu(0)], 10), "")


@pytest.mark.parametrize(
    ("mib", "shown"),
    [
        # What `get_default_device_pinned_mem_limit` printed on an H200, driver 580.159.04,
        # after `set_default_device_pinned_mem_limit 0 <mib>M`.
        (512, "512M"),
        (1023, "1023M"),
        (1024, "1G"),
        (1025, "1G"),
        (1536, "1G"),
        (2047, "1G"),
        (2048, "2G"),
        (4606, "4G"),
        (35942, "35G"),
        (100000, "97G"),
        (0, ""),
    ],
)
def test_pinned_limit_as_the_daemon_prints_it(mib: int, shown: str) -> None:
    assert pinned_limit_shown(mib) == shown


def test_readbacks_follow_the_commands() -> None:
    (spec,) = mps_specs(Plan(resources=(shared([gpu(0)], 10),)))
    spec = replace(spec, pinned_mem_limits_mib=((0, 4606), (2, 512)))
    assert spec.readbacks == (
        ("get_default_device_pinned_mem_limit 0", "4G"),
        ("get_default_device_pinned_mem_limit 2", "512M"),
        ("get_default_active_thread_percentage", "10.0"),
    )
