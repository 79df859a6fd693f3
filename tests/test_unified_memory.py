"""A unified-memory GPU (GB10 / DGX Spark, Jetson Thor) on the simulated node (`sim:1xgb10`):
NVML reports no memory for it, so everything sized from memory is off there and says why,
while sharing by count works as on any GPU. The daemon itself, in both modes, is driven in
tests/e2e/test_unified_memory_daemon.py and tests/e2e_dra/test_dra_unified_memory.py."""

from __future__ import annotations

from typing import cast

from gpuslice.backends import open_backend
from gpuslice.core.advise.advice import advise
from gpuslice.core.advise.history import GpuInfo, History, PodTrace
from gpuslice.core.allocation.softlimits import soft_limit_envs
from gpuslice.core.config.parsing import parse_config
from gpuslice.core.describe import describe, report_to_dict
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.claims import ShareUse, share_envs
from gpuslice.core.dra.publish import device_json, dra_devices
from gpuslice.core.guard import ContainerKey
from gpuslice.core.jsontypes import Json
from gpuslice.core.labels import gfd_labels
from gpuslice.core.mps import daemon_spec
from gpuslice.core.policy import share_offers
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.sharing.plan import build_plan


def config(strategy: str, replicas: int = 4) -> str:
    return (
        f"version: v1\nsharing:\n  {strategy}:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


def inventory(node: str = "sim:1xgb10") -> Inventory:
    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


def test_labels_have_no_memory_label_as_gfd_writes_none() -> None:
    inv = inventory()
    labels = gfd_labels(
        inv, build_plan(inv, parse_config(config("timeSlicing"))), timestamp=None, machine_type="x"
    )
    assert "nvidia.com/gpu.memory" not in labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB10-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.family"] == "blackwell"
    t4 = inventory("sim:1xt4")
    t4_labels = gfd_labels(
        t4, build_plan(t4, parse_config(config("timeSlicing"))), timestamp=None, machine_type="x"
    )
    assert t4_labels["nvidia.com/gpu.memory"] == "15360"


def test_mps_replicas_get_an_sm_share_and_no_pinned_memory_limit() -> None:
    inv = inventory()
    plan = build_plan(inv, parse_config(config("mps")))
    (resource,) = plan.resources
    assert len(resource.devices) == 4
    assert {d.mps.pinned_memory_limit_mib for d in resource.devices if d.mps} == {None}
    assert {d.mps.active_thread_percentage for d in resource.devices if d.mps} == {25}
    spec = daemon_spec(resource, "/run/nvidia/mps")
    assert spec is not None
    assert spec.pinned_mem_limits_mib == ()
    assert spec.active_thread_percentage == 25


def test_dra_device_has_no_memory_capacity_and_is_shared_by_count() -> None:
    inv = inventory()
    plan = build_plan(inv, parse_config(config("timeSlicing")))
    (device,) = dra_devices(inv)
    offer = share_offers(plan)[device.uuid]
    assert "memory" not in device_json(device, [])["capacity"]
    shared = device_json(device, [], offer)
    assert shared["allowMultipleAllocations"] is True
    assert set(shared["capacity"]) == {"shares", "cores"}  # no memory
    assert shared["capacity"]["shares"]["value"] == "4"


def test_a_share_on_unified_memory_gets_no_memory_limit_envs() -> None:
    mps = share_envs(ShareUse(1, 4, 0, SharingStrategy.MPS), 0)
    assert mps == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    ts = share_envs(ShareUse(2, 4, 0, SharingStrategy.TIME_SLICING), 0)
    assert ts["GPUSLICE_GPU_FRACTION"] == "0.5"
    assert "GPUSLICE_MEMORY_LIMIT_MIB" not in ts


def test_describe_says_why_memory_is_off() -> None:
    inv = inventory()
    report = describe(build_plan(inv, parse_config(config("mps"))), inv)
    (note,) = [w for w in report.warnings if "unified memory" in w]
    assert "NVIDIA GB10" in note
    assert "no MPS pinned memory limit" in note
    (gpu,) = cast(list[Json], report_to_dict(report)["devices"])
    (share,) = gpu["resources"]
    assert "no pinned memory limit" in share["share"]
    assert (share["memory_mib"], share["memory_enforced"]) == (0, False)


def test_advise_says_why_it_sizes_nothing_on_unified_memory() -> None:
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    trace = PodTrace(
        key=ContainerKey("ml", "p", "c"),
        gpu_uuid=uuid,
        first=0,
        memory_mib=(1000, 2000, 3000),
        sm_percent=(10.0, 20.0, 30.0),
        entitled_sm_fraction=0.25,
    )
    history = History(0.0, 60.0, 3, {uuid: GpuInfo(uuid, "NVIDIA GB10", 0)}, (trace,))
    (model,) = advise(history).models
    assert model.time_slicing is None
    assert model.mps is None
    assert any("unified memory" in n for n in model.notes), model.notes


def test_time_sliced_replicas_get_the_fraction_hint_and_no_memory_limit_hint() -> None:
    """A memory limit of 0 MiB would have a self-sizing program (vLLM) ask for nothing."""
    inv = inventory()
    (resource,) = build_plan(inv, parse_config(config("timeSlicing"))).resources
    envs = soft_limit_envs(resource.devices[:2])
    assert envs["GPUSLICE_GPU_FRACTION"] == "0.5"
    assert envs["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert "GPUSLICE_MEMORY_LIMIT_MIB" not in envs
