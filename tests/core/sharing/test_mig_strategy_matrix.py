"""Every MIG strategy on every modelled MIG GPU, from a simulated node to the plan.

The path is the one the daemon takes: `open_backend(spec).inventory()`, `parse_config`,
`build_plan`. Full single-profile layouts cover every profile of every model; a layout with
several profiles shows where `single` and `mixed` part ways.
"""

from __future__ import annotations

import pytest

from gpuslice.backends.simulated.models import MODELS
from gpuslice.core.devices import Inventory, MigDevice
from gpuslice.core.sharing.model import Plan
from gpuslice.core.sharing.plan import build_plan
from tests.core.sharing.mig_nodes import (
    MAX_INSTANCES,
    MIG_MODELS,
    MIXED_LAYOUTS,
    PRODUCTS,
    inventory,
    mig_resource,
    seed,
    strategy_config,
)

GPUS = 2
"""GPUs per node in the matrix: counts then show per-node totals, not one GPU's."""

FULL_LAYOUTS = [
    (model, profile, count)
    for model, table in MAX_INSTANCES.items()
    for profile, count in table.items()
]


def _full_node(model: str, profile: str, count: int) -> Inventory:
    return inventory(f"sim:{GPUS}x{model}/mig={profile}*{count}")


def test_the_matrix_covers_every_mig_capable_model() -> None:
    assert {k for k, m in MODELS.items() if m.mig_capable} == set(MIG_MODELS)
    for key in MIG_MODELS:
        geometry = MODELS[key].mig
        assert geometry is not None
        assert {p.name for p in geometry.profiles} == set(MAX_INSTANCES[key])


def _mig_uuids(inv: Inventory) -> list[str]:
    return [m.uuid for g in inv.gpus for m in g.mig_devices]


def _index_ids(plan: Plan, name: str) -> list[str]:
    res = plan.resource(name)
    assert res is not None, plan.counts()
    return [d.physical.index_id for d in res.devices]


@pytest.mark.parametrize(("model", "profile", "count"), FULL_LAYOUTS)
def test_none_advertises_whole_gpus_and_warns(model: str, profile: str, count: int) -> None:
    inv = _full_node(model, profile, count)
    plan = build_plan(inv, strategy_config("none"))
    assert plan.counts() == {"nvidia.com/gpu": GPUS}
    res = plan.resource("nvidia.com/gpu")
    assert res is not None
    assert [str(d.id) for d in res.devices] == [str(g.uuid) for g in inv.gpus]
    assert {d.physical.kind for d in res.devices} == {"gpu"}
    assert {d.physical.product_name for d in res.devices} == {PRODUCTS[model]}
    assert [w for w in plan.warnings if "MIG enabled but migStrategy is 'none'" in w] == [
        f"GPU {i} has MIG enabled but migStrategy is 'none': it is advertised as a whole GPU, "
        "which containers cannot use while MIG is on"
        for i in range(GPUS)
    ]


@pytest.mark.parametrize(("model", "profile", "count"), FULL_LAYOUTS)
def test_single_advertises_each_mig_device_as_a_gpu(model: str, profile: str, count: int) -> None:
    inv = _full_node(model, profile, count)
    plan = build_plan(inv, strategy_config("single"))
    assert plan.counts() == {"nvidia.com/gpu": GPUS * count}
    assert plan.warnings == ()
    res = plan.resource("nvidia.com/gpu")
    assert res is not None
    assert res.socket_name == "nvidia-gpu.sock"
    assert [d.id for d in res.devices] == _mig_uuids(inv)
    assert all(d.id.startswith("MIG-") for d in res.devices)
    assert _index_ids(plan, "nvidia.com/gpu") == [
        f"{g}:{j}" for g in range(GPUS) for j in range(count)
    ]
    by_uuid: dict[str, MigDevice] = {m.uuid: m for g in inv.gpus for m in g.mig_devices}
    for dev in res.devices:
        phys = dev.physical
        mig = by_uuid[phys.uuid]
        assert (phys.kind, phys.profile, phys.gpu_uuid) == ("mig", profile, mig.parent_uuid)
        assert (phys.memory_mib, phys.multiprocessors) == (mig.memory_mib, mig.multiprocessors)
        assert (phys.gi_id, phys.ci_id) == (mig.gi_id, mig.ci_id)
        # A MIG device is a fraction of its GPU: never the whole card's memory or SMs.
        assert phys.memory_mib * count <= MODELS[model].memory_mib
        assert phys.multiprocessors <= MODELS[model].multiprocessors


@pytest.mark.parametrize(("model", "profile", "count"), FULL_LAYOUTS)
def test_mixed_advertises_one_resource_per_profile(model: str, profile: str, count: int) -> None:
    inv = _full_node(model, profile, count)
    plan = build_plan(inv, strategy_config("mixed"))
    name = mig_resource(profile)
    assert plan.counts() == {name: GPUS * count}
    assert plan.warnings == ()
    res = plan.resource(name)
    assert res is not None
    assert res.socket_name == f"nvidia-mig-{profile.replace('+', '.')}.sock"
    assert res.strategy == "none"
    assert [d.id for d in res.devices] == _mig_uuids(inv)
    assert {(d.replica, d.replicas) for d in res.devices} == {(None, 1)}


@pytest.mark.parametrize("model", MIG_MODELS)
def test_several_profiles_per_strategy(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    inv = inventory(f"sim:{GPUS}x{model}/mig={layout}")

    none = build_plan(inv, strategy_config("none"))
    assert none.counts() == {"nvidia.com/gpu": GPUS}

    profiles = ", ".join(sorted(per_gpu))
    single = build_plan(inv, strategy_config("single"))
    assert single.resources == ()
    assert single.mig_layout_problem is not None
    assert single.mig_layout_problem.startswith(
        f"more than one MIG device type present on node ({profiles})"
    )

    mixed = build_plan(inv, strategy_config("mixed"))
    assert mixed.counts() == {mig_resource(p): GPUS * n for p, n in per_gpu.items()}
    for profile, n in per_gpu.items():
        ids = _index_ids(mixed, mig_resource(profile))
        assert len(ids) == GPUS * n
        # Each MIG device is advertised under its own profile, on the GPU it belongs to.
        for index_id in ids:
            gpu, _, mig = index_id.partition(":")
            device = inv.gpus[int(gpu)].mig_devices[int(mig)]
            assert device.profile == profile


@pytest.mark.parametrize("model", MIG_MODELS)
def test_mixed_with_a_gpu_out_of_mig_mode(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    inv = inventory(f"sim:1x{model}/mig={layout},1x{model}")
    plan = build_plan(inv, strategy_config("mixed"))
    assert plan.counts() == {
        "nvidia.com/gpu": 1,
        **{mig_resource(p): n for p, n in per_gpu.items()},
    }
    gpu = plan.resource("nvidia.com/gpu")
    assert gpu is not None
    assert [str(d.id) for d in gpu.devices] == [str(inv.gpus[1].uuid)]


@pytest.mark.parametrize("model", MIG_MODELS)
def test_mixed_with_an_empty_mig_gpu_warns_and_advertises_the_rest(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    plan = build_plan(
        inventory(f"sim:1x{model}/mig={layout},1x{model}/mig="), strategy_config("mixed")
    )
    assert plan.counts() == {mig_resource(p): n for p, n in per_gpu.items()}
    assert "GPU 1 has MIG enabled but no MIG devices: it advertises nothing" in plan.warnings


@pytest.mark.parametrize("model", MIG_MODELS)
def test_time_slicing_mig_resources_under_mixed(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    replicas = dict(zip(sorted(per_gpu), (2, 3, 4), strict=False))
    entries = "".join(
        f"    - name: {mig_resource(p)}\n      replicas: {r}\n" for p, r in replicas.items()
    )
    inv = inventory(f"sim:{GPUS}x{model}/mig={layout}")
    plan = build_plan(
        inv, strategy_config("mixed", f"sharing:\n  timeSlicing:\n    resources:\n{entries}")
    )
    assert plan.counts() == {mig_resource(p): GPUS * per_gpu[p] * r for p, r in replicas.items()}
    for profile, r in replicas.items():
        res = plan.resource(mig_resource(profile))
        assert res is not None
        assert res.strategy == "time-slicing"
        migs = [m.uuid for g in inv.gpus for m in g.mig_devices if m.profile == profile]
        assert [d.id for d in res.devices] == [f"{u}::{n}" for u in migs for n in range(r)]
        assert {d.replicas for d in res.devices} == {r}
        assert {d.mps for d in res.devices} == {None}


@pytest.mark.parametrize("model", MIG_MODELS)
def test_time_slicing_rename_by_default_on_mig_resources(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    small = min(per_gpu, key=lambda p: (int(p.split("g.")[0]), p))
    text = (
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        f"    - name: {mig_resource(small)}\n      replicas: 2\n"
    )
    plan = build_plan(inventory(f"sim:1x{model}/mig={layout}"), strategy_config("mixed", text))
    shared = plan.resource(mig_resource(small) + ".shared")
    assert shared is not None
    assert shared.label_name == mig_resource(small)
    assert shared.socket_name == f"nvidia-mig-{small}.shared.sock"
    assert len(shared.devices) == 2 * per_gpu[small]
    # Profiles that are not shared keep their plain names.
    assert {p for p in per_gpu if p != small} == {
        r.name.removeprefix("nvidia.com/mig-") for r in plan.resources if r.name != shared.name
    }


@pytest.mark.parametrize("model", MIG_MODELS)
def test_time_slicing_one_mig_device_by_index(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    small = next(p for p, n in per_gpu.items() if n == 2)
    inv = inventory(f"sim:1x{model}/mig={layout}")
    target = next(m for m in inv.gpus[0].mig_devices if m.profile == small)
    text = (
        "sharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: {mig_resource(small)}\n      replicas: 3\n"
        f"      devices: ['{target.index_id}']\n"
    )
    plan = build_plan(inv, strategy_config("mixed", text))
    res = plan.resource(mig_resource(small))
    assert res is not None
    assert plan.counts()[mig_resource(small)] == 3 + 1
    assert sorted(d.id for d in res.devices if d.replica is not None) == [
        f"{target.uuid}::{n}" for n in range(3)
    ]


def test_time_slicing_whole_mig_devices_under_single() -> None:
    """Under `single` the MIG devices are `nvidia.com/gpu`, so sharing `gpu` shares them."""
    inv = inventory("sim:1xa100-40gb/mig=all-2g.10gb")
    text = (
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    plan = build_plan(inv, strategy_config("single", text))
    assert plan.counts() == {"nvidia.com/gpu": 12}
    res = plan.resource("nvidia.com/gpu")
    assert res is not None
    assert {d.physical.uuid for d in res.devices} == {m.uuid for m in inv.gpus[0].mig_devices}


# --- the seed documents' numbers, on simulated nodes -----------------------------------


def test_seed_001_a100_single_on_the_simulated_node() -> None:
    inv = inventory("sim:1xa100-80gb/mig=1g.10gb*7")
    plan = build_plan(inv, seed("001-a100-mig-single.yaml"))
    assert plan.counts() == {"nvidia.com/gpu": 7}
    res = plan.resource("nvidia.com/gpu")
    assert res is not None
    assert {(d.physical.memory_mib, d.physical.multiprocessors) for d in res.devices} == {
        (9728, 14)
    }
    gi_ids = [d.physical.gi_id for d in res.devices]
    assert sorted(g for g in gi_ids if g is not None) == list(range(7, 14))


def test_seed_001_helm_values_single_on_the_simulated_node() -> None:
    """The same config as the Helm values carry it: `mig=all-1g.10gb` is mig-parted's name."""
    plan = build_plan(
        inventory("sim:1xa100-80gb/mig=all-1g.10gb"), seed("001-a100-mig-single.yaml")
    )
    assert plan.counts() == {"nvidia.com/gpu": 7}


def test_seed_002_fine_config_on_a_simulated_a100_40gb_node() -> None:
    inv = inventory(
        "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2,1xa100-40gb/mig=7g.40gb,1xa100-40gb"
    )
    plan = build_plan(inv, seed("002-fine-a100-40gb.yaml"))
    assert plan.counts() == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 2 * 2,
        "nvidia.com/mig-2g.10gb": 1 * 2,
        "nvidia.com/mig-3g.20gb": 1 * 3,
        "nvidia.com/mig-7g.40gb": 1 * 7,
    }
    assert plan.warnings == ()
    assert {r.strategy for r in plan.resources} == {"time-slicing"}
    big = plan.resource("nvidia.com/mig-7g.40gb")
    assert big is not None
    assert {d.physical.gpu_index for d in big.devices} == {1}


def test_seed_002_fine_config_on_one_mig_gpu_only() -> None:
    """Entries for profiles the node lacks are skipped with a warning, the rest apply."""
    plan = build_plan(
        inventory("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2"),
        seed("002-fine-a100-40gb.yaml"),
    )
    assert plan.counts() == {
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
    }
    unused = sorted(w.split(":")[0] for w in plan.warnings)
    assert unused == ["sharing.timeSlicing.resources[0]", "sharing.timeSlicing.resources[4]"]
