"""`flags.dynamicMig`: gpuslice's extension next to NVIDIA's static MIG strategies. A GPU is
static or dynamic; the plan says which, and the DRA side reads it from there."""

from __future__ import annotations

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.partitions import dynamic_gpus
from gpuslice.core.errors import ConfigError
from gpuslice.core.sharing.plan import build_plan


def markers(text: str) -> tuple[str, ...]:
    inventory = open_backend("sim:3xh100-80gb/mig=").inventory()
    return build_plan(inventory, parse_config(text)).dynamic_mig


def test_dynamic_mig_marks_gpus_and_the_rest_stay_static() -> None:
    inventory = open_backend("sim:3xh100-80gb/mig=").inventory()
    second = inventory.gpus[1].uuid
    config = f"version: v1\nflags:\n  dynamicMig:\n    devices: [0, {second}]\n"
    plan = build_plan(inventory, parse_config(config))
    assert plan.dynamic_mig == ("0", second)
    assert [
        g.index for g in inventory.gpus if g.uuid in dynamic_gpus(inventory, plan.dynamic_mig)
    ] == [0, 1]
    assert markers("version: v1\n") == ()  # unset: every GPU static, as NVIDIA's
    assert markers("version: v1\nflags:\n  dynamicMig: {}\n") == ("all",)
    assert markers("version: v1\nflags:\n  dynamicMig:\n    devices: 2\n") == ("0", "1")


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ("dynamicMig:\n    devices: ['0:1']\n", "name MIG devices"),
        ("dynamicMig:\n    device: all\n", "did you mean 'devices'"),
        ("dynamicMig: true\n", "expected a mapping"),
    ],
)
def test_a_bad_marker_is_refused_naming_the_field(flags: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"flags\.dynamicMig") as err:
        parse_config(f"version: v1\nflags:\n  {flags}")
    assert why in str(err.value)


def test_a_marked_gpu_not_in_mig_mode_is_said_to_stay_whole() -> None:
    inventory = open_backend("sim:1xh100-80gb,1xh100-80gb/mig=,1xl40s").inventory()
    plan = build_plan(inventory, parse_config("version: v1\nflags:\n  dynamicMig: {}\n"))
    said = [w for w in plan.warnings if "dynamicMig" in w]
    # the H100 not in MIG mode is told; the one in MIG mode and the L40S (no MIG, under
    # `all`) are not
    assert said == [
        "GPU 0 is marked for dynamic MIG (flags.dynamicMig) but is not in MIG mode: it is "
        "published as a whole GPU (gpuslice never changes MIG mode)"
    ]
    named = build_plan(
        inventory, parse_config("version: v1\nflags:\n  dynamicMig:\n    devices: [2]\n")
    )
    assert [w for w in named.warnings if "dynamicMig" in w] == [
        "GPU 2 is marked for dynamic MIG (flags.dynamicMig) but does not support MIG: it is "
        "published as a whole GPU (gpuslice never changes MIG mode)"
    ]
