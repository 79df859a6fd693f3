"""Sharing plan for whole GPUs: counts from the seed documents, per-GPU selections, renames,
naming patterns, ordering."""

from __future__ import annotations

import pytest

from gpuslice.core.config import parse_config
from gpuslice.core.errors import PlanError
from gpuslice.core.sharing.model import Plan, ResourcePlan
from gpuslice.core.sharing.plan import build_plan
from tests.plan_nodes import l40s, node, seed, t4


def _ts(entries: str, block: str = "") -> str:
    return f"version: v1\nsharing:\n  timeSlicing:\n{block}    resources:\n{entries}"


def _res(plan: Plan, name: str) -> ResourcePlan:
    res = plan.resource(name)
    assert res is not None, plan.counts()
    return res


def test_default_config_advertises_each_gpu_once() -> None:
    inv = node(t4(0), t4(1))
    plan = build_plan(inv, parse_config(""))
    gpu = _res(plan, "nvidia.com/gpu")
    assert plan.counts() == {"nvidia.com/gpu": 2}
    assert [d.id for d in gpu.devices] == [g.uuid for g in inv.gpus]
    assert all(d.replica is None and d.replicas == 1 and d.mps is None for d in gpu.devices)
    assert gpu.strategy == "none"
    assert gpu.fail_requests_greater_than_one is False
    assert [d.physical.index_id for d in gpu.devices] == ["0", "1"]
    assert gpu.devices[1].physical.memory_mib == 15360
    assert plan.mig_strategy == "none"
    assert plan.warnings == ()


def test_seed_000_two_gpus_times_four_is_eight() -> None:
    inv = node(t4(0), t4(1))
    gpu = _res(build_plan(inv, seed("000-default-time-slicing-4.yaml")), "nvidia.com/gpu")
    expected = [f"{g.uuid}::{n}" for g in inv.gpus for n in range(4)]
    assert [d.id for d in gpu.devices] == expected
    assert [d.replica for d in gpu.devices] == [0, 1, 2, 3] * 2
    assert {d.replicas for d in gpu.devices} == {4}
    assert gpu.strategy == "time-slicing"
    assert gpu.fail_requests_greater_than_one is False
    assert not gpu.renamed


def test_seed_001_one_l40s_times_ten() -> None:
    plan = build_plan(node(l40s(0)), seed("001-ls40-time-slicing-10.yaml"))
    assert plan.counts() == {"nvidia.com/gpu": 10}
    assert _res(plan, "nvidia.com/gpu").fail_requests_greater_than_one is True


def test_seed_003_eight_gpus_times_five_is_forty() -> None:
    plan = build_plan(node(*(l40s(i) for i in range(8))), seed("003-time-slicing-replicas-5.yaml"))
    assert plan.counts() == {"nvidia.com/gpu": 40}


def test_seed_002_rename_by_default_moves_everything_to_shared() -> None:
    plan = build_plan(node(*(t4(i) for i in range(4))), seed("002-tesla-t4-rename-by-default.yaml"))
    assert plan.counts() == {"nvidia.com/gpu.shared": 16}
    shared = _res(plan, "nvidia.com/gpu.shared")
    assert shared.label_name == "nvidia.com/gpu"
    assert shared.renamed
    assert shared.socket_name == "nvidia-gpu.shared.sock"


def test_seed_002_without_rename_keeps_the_name() -> None:
    plan = build_plan(node(*(t4(i) for i in range(4))), seed("002-fine-tesla-t4.yaml"))
    assert plan.counts() == {"nvidia.com/gpu": 16}


def test_rename_by_default_keeps_the_base_name_for_unselected_gpus() -> None:
    text = _ts(
        "    - name: gpu\n      replicas: 3\n      devices: [1]\n", "    renameByDefault: true\n"
    )
    inv = node(t4(0), t4(1), t4(2))
    plan = build_plan(inv, parse_config(text))
    assert plan.counts() == {"nvidia.com/gpu": 2, "nvidia.com/gpu.shared": 3}
    assert [d.id for d in _res(plan, "nvidia.com/gpu").devices] == [
        inv.gpus[0].uuid,
        inv.gpus[2].uuid,
    ]
    assert _res(plan, "nvidia.com/gpu").strategy == "none"
    assert {d.physical.gpu_index for d in _res(plan, "nvidia.com/gpu.shared").devices} == {1}


def test_disjoint_entries_give_per_gpu_replica_counts() -> None:
    text = _ts(
        "    - name: gpu\n      replicas: 8\n      devices: [0]\n"
        "    - name: gpu\n      replicas: 2\n      devices: [1, 2, 3]\n"
    )
    inv = node(*(l40s(i) for i in range(4)))
    gpu = _res(build_plan(inv, parse_config(text)), "nvidia.com/gpu")
    per_gpu = {
        g.index: [d for d in gpu.devices if d.physical.gpu_index == g.index] for g in inv.gpus
    }
    assert {i: len(ds) for i, ds in per_gpu.items()} == {0: 8, 1: 2, 2: 2, 3: 2}
    assert {d.replicas for d in per_gpu[0]} == {8}
    assert {d.replicas for d in per_gpu[3]} == {2}
    assert [d.physical.gpu_index for d in gpu.devices] == sorted(
        d.physical.gpu_index for d in gpu.devices
    )


def test_count_selects_the_first_gpus_and_leaves_the_rest_exclusive() -> None:
    inv = node(*(t4(i) for i in range(4)))
    gpu = _res(
        build_plan(
            inv, parse_config(_ts("    - name: gpu\n      replicas: 3\n      devices: 2\n"))
        ),
        "nvidia.com/gpu",
    )
    assert len(gpu.devices) == 3 + 3 + 1 + 1
    exclusive = [d for d in gpu.devices if d.replica is None]
    assert [d.id for d in exclusive] == [inv.gpus[2].uuid, inv.gpus[3].uuid]
    assert gpu.strategy == "time-slicing"


def test_selection_by_uuid_and_index() -> None:
    inv = node(*(t4(i) for i in range(4)))
    text = _ts(f"    - name: gpu\n      replicas: 2\n      devices: [{inv.gpus[3].uuid}, 1]\n")
    gpu = _res(build_plan(inv, parse_config(text)), "nvidia.com/gpu")
    shared = sorted({d.physical.gpu_index for d in gpu.devices if d.replica is not None})
    assert shared == [1, 3]
    assert len(gpu.devices) == 2 + 2 + 1 + 1


def test_explicit_rename_and_unshared_rename() -> None:
    text = _ts(
        "    - name: gpu\n      replicas: 4\n      devices: [0]\n      rename: gpu.small\n"
        "    - name: gpu\n      replicas: 1\n      devices: [1]\n      rename: gpu.dedicated\n"
    )
    inv = node(l40s(0), l40s(1), l40s(2))
    plan = build_plan(inv, parse_config(text))
    assert plan.counts() == {
        "nvidia.com/gpu": 1,
        "nvidia.com/gpu.dedicated": 1,
        "nvidia.com/gpu.small": 4,
    }
    dedicated = _res(plan, "nvidia.com/gpu.dedicated")
    assert dedicated.devices[0].id == inv.gpus[1].uuid
    assert dedicated.strategy == "none"
    assert dedicated.label_name == "nvidia.com/gpu"
    assert _res(plan, "nvidia.com/gpu.small").strategy == "time-slicing"


def test_replicas_one_means_not_shared() -> None:
    inv = node(t4(0), t4(1))
    gpu = _res(
        build_plan(inv, parse_config(_ts("    - name: gpu\n      replicas: 1\n"))), "nvidia.com/gpu"
    )
    assert [d.id for d in gpu.devices] == [g.uuid for g in inv.gpus]
    assert gpu.strategy == "none"


def test_a_device_the_node_lacks_is_an_error_naming_it() -> None:
    text = _ts("    - name: gpu\n      replicas: 2\n      devices: [0, 5]\n")
    with pytest.raises(PlanError) as caught:
        build_plan(node(t4(0), t4(1)), parse_config(text))
    message = str(caught.value)
    assert "sharing.timeSlicing.resources[0].devices: device '5'" in message
    assert "0, 1" in message


def test_an_unknown_uuid_is_an_error() -> None:
    missing = "GPU-00000000-0000-4000-8000-00000000dead"
    text = _ts(f"    - name: gpu\n      replicas: 2\n      devices: [{missing}]\n")
    with pytest.raises(PlanError, match=f"device '{missing}'"):
        build_plan(node(t4(0)), parse_config(text))


def test_a_count_larger_than_the_node_is_an_error() -> None:
    text = _ts("    - name: gpu\n      replicas: 2\n      devices: 3\n")
    with pytest.raises(PlanError, match="3 devices requested but this node has only 2"):
        build_plan(node(t4(0), t4(1)), parse_config(text))


def test_overlap_only_visible_on_the_node_is_caught() -> None:
    inv = node(t4(0), t4(1), t4(2))
    text = _ts(
        "    - name: gpu\n      replicas: 2\n      devices: 2\n"
        f"    - name: gpu\n      replicas: 4\n      devices: [{inv.gpus[1].uuid}]\n"
    )
    with pytest.raises(PlanError) as caught:
        build_plan(inv, parse_config(text))
    assert "sharing.timeSlicing.resources[1].devices: device 1" in str(caught.value)
    assert "also selected by sharing.timeSlicing.resources[0]" in str(caught.value)


def test_entry_for_an_absent_resource_is_a_warning() -> None:
    text = _ts("    - name: gpu\n      replicas: 2\n    - name: mig-1g.5gb\n      replicas: 2\n")
    plan = build_plan(node(t4(0)), parse_config(text))
    assert plan.counts() == {"nvidia.com/gpu": 2}
    assert len(plan.warnings) == 1
    assert "sharing.timeSlicing.resources[1]" in plan.warnings[0]
    assert "nvidia.com/mig-1g.5gb" in plan.warnings[0]


def test_gpu_patterns_name_resources_first_match_wins() -> None:
    text = (
        "version: v1\nresources:\n  gpus:\n"
        "  - {pattern: 'Tesla T4', name: t4}\n  - {pattern: '*L40S', name: l40s}\n"
        "  - {pattern: '*', name: gpu}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: l40s, replicas: 3}\n"
    )
    plan = build_plan(node(t4(0), l40s(1), l40s(2)), parse_config(text))
    assert plan.counts() == {"nvidia.com/l40s": 6, "nvidia.com/t4": 1}
    assert _res(plan, "nvidia.com/l40s").label_name == "nvidia.com/l40s"


def test_patterns_are_anchored() -> None:
    text = "version: v1\nresources:\n  gpus:\n  - {pattern: 'T4', name: t4}\n"
    with pytest.raises(PlanError, match="GPU name 'Tesla T4' does not match any resource patterns"):
        build_plan(node(t4(0)), parse_config(text))


def test_resources_are_sorted_and_devices_ordered_by_gpu() -> None:
    text = (
        "version: v1\nresources:\n  gpus:\n"
        "  - {pattern: 'Tesla*', name: z-t4}\n  - {pattern: '*', name: a-other}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: z-t4, replicas: 2}\n"
    )
    shuffled = node(t4(2), l40s(1), t4(0))
    plan = build_plan(shuffled, parse_config(text))
    assert [r.name for r in plan.resources] == ["nvidia.com/a-other", "nvidia.com/z-t4"]
    t4s = _res(plan, "nvidia.com/z-t4").devices
    assert [(d.physical.gpu_index, d.replica) for d in t4s] == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert build_plan(shuffled, parse_config(text)) == plan


def test_plan_carries_allocate_settings_and_strategy() -> None:
    config = parse_config(
        "flags:\n  plugin:\n    deviceIDStrategy: index\n"
        "    sharedDevicesAllocationPolicy: packed\n"
    )
    plan = build_plan(node(t4(0)), config)
    assert plan.allocate.device_id_strategy == "index"
    assert plan.allocate.allocation_policy == "packed"


def test_a_node_without_gpus_advertises_nothing() -> None:
    assert build_plan(node(), seed("000-default-time-slicing-4.yaml")).resources == ()


def test_warnings_about_mig_strategy_are_told_apart_for_dra_mode() -> None:
    """DRA mode publishes MIG devices whatever migStrategy says, so the agent drops only the
    advice about the strategy; the plan keeps every warning for describe and the logs."""
    from gpuslice.backends import open_backend

    backend = open_backend("sim:1xa100-40gb/mig=1g.5gb*7,1xa100-40gb", environ={})
    try:
        inv = backend.inventory()
    finally:
        backend.close()
    plan = build_plan(inv, parse_config(""))
    (advice,) = plan.mig_strategy_warnings
    assert "migStrategy is 'none'" in advice
    assert advice in plan.warnings
