"""Memory hints for time-sliced replicas in Allocate (gpuslice's addition to NVIDIA's env)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpuslice.core.allocation import build_allocation
from gpuslice.core.allocation.softlimits import SOFT_LIMIT_ENVS
from gpuslice.core.sharing.model import AllocateSettings, ResourcePlan, SharingStrategy
from tests.core.allocation.alloc_plans import exclusive, gpu, mig, mig_gpu, shared, whole

G0, G1 = gpu(0), gpu(1)  # 15360 MiB each
ON = AllocateSettings(memory_soft_limits=True)


def envs(
    resource: ResourcePlan, ids: Sequence[str], settings: AllocateSettings = ON
) -> dict[str, str]:
    return dict(build_allocation(resource, settings, ids, annotation_id="rid").envs)


@pytest.mark.parametrize(
    ("replicas", "ids", "fraction", "mib"),
    [
        (4, ["GPU-0000::1"], "0.25", "3840"),
        (4, ["GPU-0000::1", "GPU-0000::3"], "0.5", "7680"),
        (3, ["GPU-0000::0"], "0.3333", "5120"),
        (4, ["GPU-0000::0", "GPU-0001::0", "GPU-0001::1"], "0.25", "3840"),  # the tighter GPU
    ],
)
def test_time_sliced_replicas_get_their_share(
    replicas: int, ids: list[str], fraction: str, mib: str
) -> None:
    resource = shared([whole(G0), whole(G1)], replicas, fail_over_one=False)
    got = envs(resource, ids)
    assert got["GPUSLICE_GPU_FRACTION"] == fraction
    assert got["XLA_PYTHON_CLIENT_MEM_FRACTION"] == fraction
    assert got["GPUSLICE_MEMORY_LIMIT_MIB"] == mib
    assert got["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "NVIDIA_VISIBLE_DEVICES" in got


def test_a_time_sliced_mig_device_shares_the_mig_devices_memory() -> None:
    a100 = mig_gpu(0, [("3g.20gb", 2, 0, 19968, 42)])
    resource = shared([mig(a100, 0)], 2, name="nvidia.com/mig-3g.20gb")
    got = envs(resource, [resource.devices[0].id])
    assert (got["GPUSLICE_GPU_FRACTION"], got["GPUSLICE_MEMORY_LIMIT_MIB"]) == ("0.5", "9984")


def test_off_means_exactly_nvidias_env() -> None:
    resource = shared([whole(G0)], 4)
    assert envs(resource, ["GPU-0000::1"], AllocateSettings()) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-0000"
    }


def test_no_hints_for_exclusive_or_mps() -> None:
    assert not set(SOFT_LIMIT_ENVS) & set(envs(exclusive([whole(G0)]), ["GPU-0000"]))
    mps = shared([whole(G0)], 4, strategy=SharingStrategy.MPS)
    assert not set(SOFT_LIMIT_ENVS) & set(envs(mps, ["GPU-0000::0"]))
