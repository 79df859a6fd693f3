"""Sharing plan for MIG strategies and MPS: NVIDIA's refusals, seed counts, MPS shares."""

from __future__ import annotations

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.devices import Gpu
from gpuslice.core.errors import PlanError
from gpuslice.core.sharing.model import MpsShare, Plan
from gpuslice.core.sharing.plan import build_plan
from tests.plan_nodes import ONE_G_10GB, a100_40, a100_80, l40s, node, seed, t4, v100

SINGLE = "version: v1\nflags:\n  migStrategy: single\n"
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"


def _single_problem(plan: Plan) -> str:
    """`single` on a layout it cannot serve: nothing advertised, the reason on the plan."""
    assert plan.resources == ()
    assert plan.mig_layout_problem is not None
    return plan.mig_layout_problem


def _mps(entries: str, flags: str = "") -> str:
    return f"version: v1\n{flags}sharing:\n  mps:\n    resources:\n{entries}"


# --- MIG strategies ---------------------------------------------------------------------


def test_seed_001_single_seven_1g_10gb_is_seven_gpus() -> None:
    inv = node(a100_80(0, [ONE_G_10GB] * 7))
    plan = build_plan(inv, seed("001-a100-mig-single.yaml"))
    assert plan.counts() == {"nvidia.com/gpu": 7}
    gpu = plan.resources[0]
    assert [d.physical.index_id for d in gpu.devices] == [f"0:{j}" for j in range(7)]
    assert [d.id for d in gpu.devices] == [m.uuid for m in inv.gpus[0].mig_devices]
    first = gpu.devices[0].physical
    assert (first.kind, first.profile, first.memory_mib, first.multiprocessors) == (
        "mig",
        "1g.10gb",
        9728,
        14,
    )
    assert first.gpu_uuid == inv.gpus[0].uuid
    assert plan.mig_strategy == "single"


def test_single_with_mig_off_everywhere_advertises_whole_gpus() -> None:
    plan = build_plan(node(a100_80(0), a100_80(1)), parse_config(SINGLE))
    assert plan.counts() == {"nvidia.com/gpu": 2}
    assert {d.physical.kind for d in plan.resources[0].devices} == {"gpu"}


def test_single_refuses_mixed_mig_modes() -> None:
    plan = build_plan(node(a100_80(0, [ONE_G_10GB]), a100_80(1)), parse_config(SINGLE))
    assert "all devices on the node must be configured with the same migEnabled value" in (
        _single_problem(plan)
    )


def test_single_refuses_a_mig_gpu_without_devices() -> None:
    plan = build_plan(node(a100_80(0, [ONE_G_10GB]), a100_80(1, [])), parse_config(SINGLE))
    assert "device 1 has no MIG devices configured" in _single_problem(plan)


def test_single_refuses_two_profiles() -> None:
    gpu = a100_80(0, [ONE_G_10GB, ("2g.20gb", 19968, 28)])
    plan = build_plan(node(gpu), parse_config(SINGLE))
    assert "more than one MIG device type present on node (1g.10gb, 2g.20gb)" in (
        _single_problem(plan)
    )


def _fine_node() -> tuple[Gpu, ...]:
    """A100-40GB node: GPU 0 split 3g+2g+1g+1g, GPU 1 one 7g, GPU 2 without MIG."""
    return (
        a100_40(
            0,
            [
                ("3g.20gb", 19968, 42),
                ("2g.10gb", 9856, 28),
                ("1g.5gb", 4864, 14),
                ("1g.5gb", 4864, 14),
            ],
        ),
        a100_40(1, [("7g.40gb", 40192, 98)]),
        a100_40(2),
    )


def test_seed_002_fine_config_on_a_mixed_layout() -> None:
    inv = node(*_fine_node())
    plan = build_plan(inv, seed("002-fine-a100-40gb.yaml"))
    assert plan.counts() == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
        "nvidia.com/mig-7g.40gb": 7,
    }
    small = plan.resource("nvidia.com/mig-1g.5gb")
    assert small is not None
    assert small.strategy == "time-slicing"
    assert [(d.physical.index_id, d.replica) for d in small.devices] == [
        ("0:2", 0),
        ("0:2", 1),
        ("0:3", 0),
        ("0:3", 1),
    ]
    assert small.devices[0].id == f"{inv.gpus[0].mig_devices[2].uuid}::0"
    assert plan.warnings == ()


def test_mixed_default_names_replace_plus_with_dot() -> None:
    gpu = a100_80(0, [("1g.10gb+me", 9728, 14), ONE_G_10GB, ("3g.40gb", 40192, 42)])
    plan = build_plan(node(gpu, t4(1)), parse_config(MIXED))
    assert plan.counts() == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.10gb": 1,
        "nvidia.com/mig-1g.10gb.me": 1,
        "nvidia.com/mig-3g.40gb": 1,
    }


def test_mixed_defaults_do_not_name_compute_sliced_profiles() -> None:
    gpu = a100_80(0, [("1c.3g.40gb", 40192, 14)])
    with pytest.raises(
        PlanError, match=r"MIG profile '1c\.3g\.40gb' does not match any resource patterns"
    ):
        build_plan(node(gpu), parse_config(MIXED))


def test_user_mig_patterns() -> None:
    text = (
        MIXED
        + "resources:\n  mig:\n  - {pattern: '1g.*', name: mig-small}\n"
        + "  - {pattern: '*', name: mig-big}\n"
    )
    gpu = a100_80(0, [ONE_G_10GB, ("1g.10gb+me", 9728, 14), ("3g.40gb", 40192, 42)])
    plan = build_plan(node(gpu), parse_config(text))
    assert plan.counts() == {"nvidia.com/mig-big": 1, "nvidia.com/mig-small": 2}


def test_time_slicing_selects_mig_devices_by_index() -> None:
    text = (
        MIXED
        + "sharing:\n  timeSlicing:\n    resources:\n"
        + "    - {name: mig-1g.10gb, replicas: 3, devices: ['0:1']}\n"
    )
    plan = build_plan(node(a100_80(0, [ONE_G_10GB] * 3)), parse_config(text))
    res = plan.resource("nvidia.com/mig-1g.10gb")
    assert res is not None
    assert [(d.physical.index_id, d.replica) for d in res.devices] == [
        ("0:0", None),
        ("0:1", 0),
        ("0:1", 1),
        ("0:1", 2),
        ("0:2", None),
    ]


def test_none_strategy_ignores_mig_and_warns() -> None:
    plan = build_plan(node(a100_80(0, [ONE_G_10GB] * 7)), parse_config(""))
    assert plan.counts() == {"nvidia.com/gpu": 1}
    assert plan.resources[0].devices[0].physical.kind == "gpu"
    assert any("MIG enabled but migStrategy is 'none'" in w for w in plan.warnings)


# --- MPS ------------------------------------------------------------------------------


def test_seed_001_l40s_mps_ten_replicas() -> None:
    inv = node(l40s(0))
    plan = build_plan(inv, seed("001-ls40-mps-10.yaml"))
    assert plan.counts() == {"nvidia.com/gpu": 10}
    gpu = plan.resources[0]
    assert gpu.strategy == "mps"
    assert gpu.fail_requests_greater_than_one is True
    assert {d.mps for d in gpu.devices} == {
        MpsShare(active_thread_percentage=10, pinned_memory_limit_mib=4606)
    }
    assert [d.id for d in gpu.devices] == [f"{inv.gpus[0].uuid}::{n}" for n in range(10)]
    assert plan.allocate.mps_root == "/run/nvidia/mps"


def test_mps_share_uses_integer_division() -> None:
    plan = build_plan(node(t4(0)), parse_config(_mps("    - {name: gpu, replicas: 3}\n")))
    assert plan.resources[0].devices[0].mps == MpsShare(33, 15360 // 3)


def test_mps_ceiling_is_48_from_compute_capability_7_5() -> None:
    build_plan(node(l40s(0)), parse_config(_mps("    - {name: gpu, replicas: 48}\n")))
    with pytest.raises(
        PlanError,
        match=r"sharing\.mps\.resources\[0\]\.replicas: invalid device maximum allowed "
        r"replicas exceeded: 49 > 48",
    ):
        build_plan(node(l40s(0)), parse_config(_mps("    - {name: gpu, replicas: 49}\n")))


def test_mps_ceiling_is_16_below_compute_capability_7_5() -> None:
    assert build_plan(
        node(v100(0)), parse_config(_mps("    - {name: gpu, replicas: 16}\n"))
    ).counts() == {"nvidia.com/gpu": 16}
    with pytest.raises(
        PlanError, match=r"17 > 16 \(GPU 0 'Tesla V100-SXM2-16GB', compute capability 7\.0"
    ):
        build_plan(node(v100(0)), parse_config(_mps("    - {name: gpu, replicas: 17}\n")))


def test_mps_on_mig_devices_is_refused() -> None:
    config = parse_config(
        _mps("    - {name: gpu, replicas: 2}\n", flags="flags:\n  migStrategy: single\n")
    )
    with pytest.raises(PlanError, match="sharing using MPS is not supported for MIG devices"):
        build_plan(node(a100_80(0, [ONE_G_10GB] * 7)), config)


def test_mps_and_time_slicing_on_different_resources() -> None:
    text = (
        "version: v1\nresources:\n  gpus:\n"
        "  - {pattern: 'Tesla T4', name: t4}\n  - {pattern: '*', name: l40s}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: t4, replicas: 4}\n"
        "  mps:\n    renameByDefault: true\n    resources:\n    - {name: l40s, replicas: 2}\n"
    )
    plan = build_plan(node(t4(0), l40s(1)), parse_config(text))
    assert plan.counts() == {"nvidia.com/l40s.shared": 2, "nvidia.com/t4": 4}
    mps = plan.resource("nvidia.com/l40s.shared")
    ts = plan.resource("nvidia.com/t4")
    assert mps is not None
    assert ts is not None
    assert (mps.strategy, mps.fail_requests_greater_than_one) == ("mps", True)
    assert (ts.strategy, ts.fail_requests_greater_than_one) == ("time-slicing", False)
    assert {d.mps for d in ts.devices} == {None}


def test_renames_that_merge_two_resources_are_refused() -> None:
    text = (
        "version: v1\nresources:\n  gpus:\n"
        "  - {pattern: 'Tesla T4', name: t4}\n  - {pattern: '*', name: l40s}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: t4, replicas: 4, rename: shared}\n"
        "  mps:\n    resources:\n    - {name: l40s, replicas: 2, rename: shared}\n"
    )
    with pytest.raises(PlanError, match=r"nvidia\.com/shared would hold both"):
        build_plan(node(t4(0), l40s(1)), parse_config(text))


def test_mps_replicas_one_is_an_exclusive_gpu() -> None:
    plan = build_plan(node(l40s(0)), parse_config(_mps("    - {name: gpu, replicas: 1}\n")))
    device = plan.resources[0].devices[0]
    assert (device.replica, device.replicas, device.mps) == (None, 1, None)
    assert plan.resources[0].strategy == "none"


def test_mps_root_from_the_config_is_kept() -> None:
    config = parse_config(
        _mps("    - {name: gpu, replicas: 2}\n", flags="flags:\n  mpsRoot: /var/mps\n")
    )
    assert build_plan(node(t4(0)), config).allocate.mps_root == "/var/mps"


def test_mps_on_a_whole_gpu_in_mig_mode_is_refused() -> None:
    """Under migStrategy none a MIG-enabled GPU is advertised whole, but no CUDA context (so
    no MPS server) can run on it; GFD refuses this too ("MPS sharing is not supported for
    mig devices")."""
    backend = open_backend("sim:1xa100-40gb/mig=3g.20gb*2")
    inventory = backend.inventory()
    backend.close()
    config = parse_config(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n"
        "      replicas: 2\n"
    )
    with pytest.raises(PlanError, match="MPS sharing is not supported for mig devices"):
        build_plan(inventory, config)
