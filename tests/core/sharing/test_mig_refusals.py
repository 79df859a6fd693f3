"""What NVIDIA would refuse on a MIG node is refused here, on every modelled MIG GPU.

Three kinds: `single` on a node it cannot describe (NVIDIA's start-up errors), MIG layouts
the driver would not create (with what would fit), and configs that cannot apply to MIG
devices (MPS, selections of devices that are not there).
"""

from __future__ import annotations

import re

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.errors import ConfigError, PlanError
from gpuslice.core.labels import gfd_labels
from gpuslice.core.sharing.model import Plan
from gpuslice.core.sharing.plan import build_plan
from gpuslice.ports import BackendError
from tests.core.sharing.mig_nodes import (
    MAX_INSTANCES,
    MIG_MODELS,
    MIXED_LAYOUTS,
    PRODUCTS,
    inventory,
    mig_resource,
    strategy_config,
)

SMALLEST = {model: next(iter(table)) for model, table in MAX_INSTANCES.items()}
"""The guide lists the smallest profile first: 1g.5gb, 1g.10gb, 1g.6gb, 1g.10gb, 1g.18gb."""


def _single_problem(plan: Plan) -> str:
    """`single` on a layout it cannot serve: nothing advertised, the reason on the plan."""
    assert plan.resources == ()
    assert plan.mig_layout_problem is not None
    return plan.mig_layout_problem


def _all_small(model: str) -> str:
    return f"{SMALLEST[model]}*{MAX_INSTANCES[model][SMALLEST[model]]}"


# --- single: NVIDIA's start-up errors -----------------------------------------------------


@pytest.mark.parametrize("model", MIG_MODELS)
def test_single_refuses_mig_enabled_next_to_mig_disabled(model: str) -> None:
    inv = inventory(f"sim:1x{model},1x{model}/mig={_all_small(model)},1x{model}")
    text = _single_problem(build_plan(inv, strategy_config("single")))
    assert text.startswith(
        "all devices on the node must be configured with the same migEnabled value "
    )
    assert "MIG enabled on GPUs [1], disabled on GPUs [0, 2]" in text
    assert "use migStrategy 'mixed'" in text


@pytest.mark.parametrize("model", MIG_MODELS)
def test_single_refuses_a_mig_gpu_without_mig_devices(model: str) -> None:
    inv = inventory(f"sim:1x{model}/mig={_all_small(model)},1x{model}/mig=")
    text = _single_problem(build_plan(inv, strategy_config("single")))
    assert text.startswith("device 1 has no MIG devices configured; ")
    assert "or use migStrategy 'mixed'" in text


def test_single_refuses_a_node_whose_only_gpu_has_no_mig_devices() -> None:
    text = _single_problem(build_plan(inventory("sim:2xa30/mig="), strategy_config("single")))
    assert text.startswith("device 0 has no MIG devices configured")


@pytest.mark.parametrize("model", MIG_MODELS)
def test_single_refuses_different_profiles_on_different_gpus(model: str) -> None:
    small = SMALLEST[model]
    full = list(MAX_INSTANCES[model])[-1]
    inv = inventory(f"sim:1x{model}/mig={small},1x{model}/mig={full}")
    text = _single_problem(build_plan(inv, strategy_config("single")))
    names = ", ".join(sorted({small, full}))
    assert text.startswith(f"more than one MIG device type present on node ({names})")
    # mixed takes the same node as it is.
    mixed = build_plan(inv, strategy_config("mixed"))
    assert mixed.counts() == {mig_resource(small): 1, mig_resource(full): 1}


def test_single_refuses_two_models_with_their_own_profiles() -> None:
    inv = inventory("sim:1xa100-40gb/mig=all-1g.5gb,1xa100-80gb/mig=all-1g.10gb")
    text = _single_problem(build_plan(inv, strategy_config("single")))
    assert re.search(r"more than one MIG device type .*\(1g\.10gb, 1g\.5gb\)", text)


def test_single_refuses_a_me_profile_next_to_its_plain_profile() -> None:
    inv = inventory("sim:1xh100-80gb/mig=1g.10gb+me+1g.10gb*6")
    text = _single_problem(build_plan(inv, strategy_config("single")))
    assert "(1g.10gb, 1g.10gb+me)" in text


def test_single_compares_mig_attributes_like_nvidia_device_map_go() -> None:
    """NVIDIA `internal/rm/device_map.go` (assertAllMigDevicesAreValid, uniform): MIG devices
    are compared by NVML attributes, so 1g.10gb on an A100-80GB (14 SMs) next to 1g.10gb on
    an H100 (16 SMs) is more than one MIG device type, though the profile names agree."""
    inv = inventory("sim:1xa100-80gb/mig=all-1g.10gb,1xh100-80gb/mig=all-1g.10gb")
    assert {m.profile for m in inv.mig_devices()} == {"1g.10gb"}
    plan = build_plan(inv, strategy_config("single"))
    text = _single_problem(plan)
    assert text.startswith("more than one MIG device type present on node (1g.10gb with ")
    labels = gfd_labels(inv, plan, timestamp=None, machine_type="")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-MIG-INVALID"


# --- layouts the driver would not create ---------------------------------------------------


def _fits(model: str) -> str:
    """The 'what fits' list every layout refusal ends with, from the guide's table."""
    return "profiles (with max counts): " + ", ".join(
        f"{p}*{n}" for p, n in MAX_INSTANCES[model].items()
    )


def _refusal(spec: str) -> str:
    with pytest.raises(BackendError) as err:
        open_backend(spec)
    return str(err.value)


TOO_MUCH_COMPUTE = {
    "a100-40gb": ("4g.20gb+3g.20gb+1g.5gb", 8, 7),
    "a100-80gb": ("4g.40gb+3g.40gb+1g.10gb", 8, 7),
    "a30": ("4g.24gb+1g.6gb", 5, 4),
    "h100-80gb": ("4g.40gb+2g.20gb*2", 8, 7),
    "h200": ("3g.71gb*2+2g.35gb", 8, 7),
}


@pytest.mark.parametrize("model", MIG_MODELS)
def test_layout_needing_more_compute_slices_than_the_gpu_has(model: str) -> None:
    layout, needed, has = TOO_MUCH_COMPUTE[model]
    text = _refusal(f"sim:1x{model}/mig={layout}")
    assert text.startswith(f"MIG layout {layout!r} does not fit {PRODUCTS[model]}: ")
    assert f"needs {needed} compute slices, the GPU has {has}" in text
    assert text.endswith(_fits(model))


TOO_MUCH_MEMORY = {
    "a100-40gb": "3g.20gb*2+1g.5gb",
    "a100-80gb": "1g.20gb*4+1g.10gb",
    "h100-80gb": "4g.40gb+1g.20gb*2+1g.10gb",
    "h200": "3g.71gb+1g.35gb*2+1g.18gb",
}


@pytest.mark.parametrize("model", sorted(TOO_MUCH_MEMORY))
def test_layout_needing_more_memory_slices_than_the_gpu_has(model: str) -> None:
    layout = TOO_MUCH_MEMORY[model]
    text = _refusal(f"sim:1x{model}/mig={layout}")
    assert text.startswith(f"MIG layout {layout!r} does not fit {PRODUCTS[model]}: ")
    assert "needs 9 memory slices, the GPU has 8" in text
    assert text.endswith(_fits(model))


FOREIGN_PROFILE = {
    "a100-40gb": "1g.18gb",
    "a100-80gb": "1g.5gb",
    "a30": "7g.40gb",
    "h100-80gb": "2g.35gb",
    "h200": "1g.10gb",
}
"""A profile of another model: the name a user copies from the wrong table."""


@pytest.mark.parametrize("model", MIG_MODELS)
def test_profile_of_another_model_is_refused_with_this_models_profiles(model: str) -> None:
    profile = FOREIGN_PROFILE[model]
    text = _refusal(f"sim:1x{model}/mig={profile}")
    assert f"{PRODUCTS[model]} has no profile {profile!r}" in text
    assert text.endswith(_fits(model))


@pytest.mark.parametrize("model", MIG_MODELS)
def test_two_me_instances_are_refused(model: str) -> None:
    me = f"{SMALLEST[model]}+me"
    with pytest.raises(BackendError, match=r"at most 1 fit|at most one \+me instance"):
        open_backend(f"sim:1x{model}/mig={me}*2")


def test_layout_on_a_gpu_without_mig_names_the_mig_models() -> None:
    assert _refusal("sim:1xl40s/mig=1g.5gb") == (
        "l40s (NVIDIA L40S) does not support MIG; MIG models: " + ", ".join(MIG_MODELS)
    )


# --- configs that cannot apply to MIG devices ----------------------------------------------

MPS_GPU = "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"


@pytest.mark.parametrize("model", MIG_MODELS)
def test_mps_on_mig_devices_under_single_is_refused(model: str) -> None:
    inv = inventory(f"sim:1x{model}/mig={_all_small(model)}")
    with pytest.raises(PlanError) as err:
        build_plan(inv, strategy_config("single", MPS_GPU))
    text = str(err.value)
    # NVIDIA's words, where in the config, which device, and what to do instead.
    assert text.startswith(
        "sharing.mps.resources[0]: sharing using MPS is not supported for MIG devices"
    )
    assert "MIG device 0:0" in text
    assert "time-slicing" in text


def test_mps_with_mixed_is_refused_before_any_gpu_is_looked_at() -> None:
    text = (
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n"
        "    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="mig-mps.yaml")
    message = str(err.value)
    assert message.startswith(
        "invalid config mig-mps.yaml: flags.migStrategy: using migStrategy 'mixed' is not "
        "supported with MPS"
    )
    assert "time-slicing for MIG resources" in message


def test_mps_replicas_one_on_mig_devices_is_no_sharing_and_allowed() -> None:
    """One replica shares nothing, so there is no MPS daemon to refuse (NVIDIA agrees)."""
    text = MPS_GPU.replace("replicas: 2", "replicas: 1")
    plan = build_plan(inventory("sim:1xa30/mig=all-1g.6gb"), strategy_config("single", text))
    assert plan.counts() == {"nvidia.com/gpu": 4}
    assert {r.strategy for r in plan.resources} == {"none"}


@pytest.mark.parametrize("model", MIG_MODELS)
def test_time_slicing_a_mig_device_that_is_not_there(model: str) -> None:
    layout, per_gpu = MIXED_LAYOUTS[model]
    small = next(p for p, n in per_gpu.items() if n == 2)
    inv = inventory(f"sim:1x{model}/mig={layout}")
    here = ", ".join(m.index_id for m in inv.gpus[0].mig_devices if m.profile == small)
    text = (
        "sharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: {mig_resource(small)}\n      replicas: 2\n      devices: ['0:9']\n"
    )
    with pytest.raises(PlanError) as err:
        build_plan(inv, strategy_config("mixed", text))
    message = str(err.value)
    assert message.startswith(
        f"sharing.timeSlicing.resources[0].devices: device '0:9' is not a "
        f"{mig_resource(small)} device on this node"
    )
    assert f"devices here: {here})" in message


def test_time_slicing_more_mig_devices_than_there_are() -> None:
    text = (
        "sharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/mig-1g.5gb\n      replicas: 2\n      devices: 3\n"
    )
    with pytest.raises(PlanError, match=r"3 devices requested but this node has only 2"):
        build_plan(
            inventory("sim:1xa100-40gb/mig=3g.20gb+2g.10gb+1g.5gb*2"),
            strategy_config("mixed", text),
        )


def test_time_slicing_selects_mig_devices_by_uuid_and_by_gi_ci_name() -> None:
    inv = inventory("sim:1xa100-40gb/mig=all-1g.5gb")
    a, b = inv.gpus[0].mig_devices[1], inv.gpus[0].mig_devices[4]
    text = (
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n"
        "      replicas: 2\n"
        f"      devices: ['{a.uuid}', 'MIG-{b.parent_uuid}/{b.gi_id}/{b.ci_id}']\n"
    )
    plan = build_plan(inv, strategy_config("mixed", text))
    res = plan.resource("nvidia.com/mig-1g.5gb")
    assert res is not None
    assert sorted(d.id for d in res.devices if d.replica is not None) == sorted(
        f"{u}::{n}" for u in (a.uuid, b.uuid) for n in range(2)
    )
    assert plan.counts() == {"nvidia.com/mig-1g.5gb": 7 - 2 + 4}


def test_user_mig_patterns_that_miss_a_profile_name_the_field() -> None:
    text = "resources:\n  mig:\n  - pattern: '1g.*'\n    name: mig-small\n"
    with pytest.raises(PlanError) as err:
        build_plan(inventory("sim:1xh200/mig=3g.71gb+1g.18gb*2"), strategy_config("mixed", text))
    assert str(err.value).startswith(
        "MIG profile '3g.71gb' does not match any resource patterns (resources.mig: '1g.*')"
    )


def test_sharing_a_mig_resource_that_single_does_not_advertise_warns() -> None:
    text = (
        "sharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/mig-1g.10gb\n      replicas: 2\n"
    )
    plan = build_plan(inventory("sim:1xa100-80gb/mig=all-1g.10gb"), strategy_config("single", text))
    assert plan.counts() == {"nvidia.com/gpu": 7}
    assert len(plan.warnings) == 1
    assert re.match(
        r"sharing\.timeSlicing\.resources\[0\]: no device on this node is advertised as "
        r"nvidia\.com/mig-1g\.10gb",
        plan.warnings[0],
    )
