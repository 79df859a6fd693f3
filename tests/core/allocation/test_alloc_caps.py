"""The toolkit hook's variables in Allocate, decided in the core from the caps capability:
only for time-sliced replicas of capable full GPUs reaching the container through CDI, one
pair per container, never where the hook would fail the pod or cap another GPU wrongly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslice.core.allocation.caps import AllocateCaps, allocation_caps_env
from gpuslice.core.allocation.response import build_allocation
from gpuslice.core.caps import GpuCapability
from gpuslice.core.policy import device_entitlements
from gpuslice.core.sharing.model import AllocateSettings, ResourcePlan, SharingStrategy
from tests.core.allocation.alloc_plans import exclusive, gpu, mig, mig_gpu, shared, whole

T4S = [gpu(0), gpu(1)]
CDI = AllocateSettings(device_list_strategies=("cdi-cri",))
ABLE = AllocateCaps({g.uuid: GpuCapability(g.uuid) for g in T4S}, entitlements={})
QUARTER = str(15360 // 4)


def _env(
    resource_ids: list[str],
    caps: AllocateCaps | None,
    settings: AllocateSettings = CDI,
    strategy: SharingStrategy = SharingStrategy.TIME_SLICING,
) -> dict[str, str]:
    resource = shared([whole(g) for g in T4S], 4, strategy=strategy, fail_over_one=False)
    caps = None if caps is None else with_table(caps, resource)
    alloc = build_allocation(resource, settings, resource_ids, annotation_id="x", caps=caps)
    return dict(alloc.envs)


def with_table(caps: AllocateCaps, resource: ResourcePlan) -> AllocateCaps:
    """`caps` with the entitlements a snapshot of `resource` would have."""
    return replace(caps, entitlements=device_entitlements([resource], {}))


def _hook(envs: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in envs.items() if k.startswith("NVIDIA_GPU_MEMORY_")}


def test_one_replica_carries_its_share_as_request_and_limit() -> None:
    envs = _env([f"{T4S[0].uuid}::0"], ABLE)
    assert _hook(envs) == {"NVIDIA_GPU_MEMORY_LIMIT": QUARTER, "NVIDIA_GPU_MEMORY_REQUEST": QUARTER}


def test_two_replicas_of_one_gpu_add_up() -> None:
    envs = _env([f"{T4S[0].uuid}::0", f"{T4S[0].uuid}::1"], ABLE)
    assert _hook(envs)["NVIDIA_GPU_MEMORY_LIMIT"] == str(15360 // 2)


def test_borrow_gives_the_whole_gpu_as_the_limit() -> None:
    envs = _env([f"{T4S[0].uuid}::0"], AllocateCaps(ABLE.capabilities, "borrow", entitlements={}))
    assert _hook(envs) == {"NVIDIA_GPU_MEMORY_LIMIT": "15360", "NVIDIA_GPU_MEMORY_REQUEST": QUARTER}


def test_gpus_needing_different_limits_get_no_pair() -> None:
    # one replica here, two there: the hook would give both GPUs one pair
    ids = [f"{T4S[0].uuid}::0", f"{T4S[1].uuid}::0", f"{T4S[1].uuid}::1"]
    assert _hook(_env(ids, ABLE)) == {}
    # the same on both: one pair fits both
    assert _hook(_env([f"{T4S[0].uuid}::0", f"{T4S[1].uuid}::0"], ABLE))


@pytest.mark.parametrize(
    "caps",
    [
        None,
        AllocateCaps({}, entitlements={}),
        AllocateCaps({g.uuid: GpuCapability(g.uuid, "cgroup-v1") for g in T4S}, entitlements={}),
        AllocateCaps({g.uuid: GpuCapability(g.uuid, "nvml-error") for g in T4S}, entitlements={}),
        AllocateCaps({g.uuid: GpuCapability(g.uuid, "caps-off") for g in T4S}, entitlements={}),
    ],
)
def test_no_pair_where_the_gpu_cannot_be_capped(caps: AllocateCaps | None) -> None:
    assert _hook(_env([f"{T4S[0].uuid}::0"], caps)) == {}


@pytest.mark.parametrize("strategies", [("envvar",), ("volume-mounts",)])
def test_no_pair_without_cdi(strategies: tuple[str, ...]) -> None:
    settings = AllocateSettings(device_list_strategies=strategies)  # type: ignore[arg-type]
    assert _hook(_env([f"{T4S[0].uuid}::0"], ABLE, settings)) == {}


def test_mps_and_exclusive_get_no_pair() -> None:
    assert _hook(_env([f"{T4S[0].uuid}::0"], ABLE, strategy=SharingStrategy.MPS)) == {}
    alone = exclusive([whole(T4S[0])])
    assert allocation_caps_env(alone.devices, ("cdi-cri",), with_table(ABLE, alone)) == {}


def test_a_time_sliced_mig_device_gets_no_pair_even_if_its_gpu_were_capable() -> None:
    a100 = mig_gpu(0, [("1g.5gb", 7, 0, 4864, 14)])
    resource = shared([mig(a100, 0)], 2)
    caps = AllocateCaps({a100.uuid: GpuCapability(a100.uuid)}, entitlements={})
    assert allocation_caps_env(resource.devices[:1], ("cdi-cri",), with_table(caps, resource)) == {}
