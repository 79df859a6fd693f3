"""Flags and environment variables over the file: same validation, errors name the source."""

from __future__ import annotations

import pytest

from gpuslice.core.config import (
    Override,
    allocate_settings,
    apply_overrides,
    parse_config,
)
from gpuslice.core.errors import ConfigError

FILE = """\
version: v1
flags:
  migStrategy: single
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    deviceListStrategy: volume-mounts
sharing:
  timeSlicing:
    resources:
    - name: gpu
      replicas: 4
"""


def test_override_wins_and_the_rest_of_the_file_stays() -> None:
    config = apply_overrides(parse_config(FILE), {"flags.migStrategy": "mixed"})
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.nvidia_driver_root == "/run/nvidia/driver"
    assert config.flags.plugin.device_list_strategy == ("volume-mounts",)
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].replicas == 4


def test_no_overrides_returns_an_equal_config() -> None:
    base = parse_config(FILE)
    assert apply_overrides(base, {}) == base
    assert apply_overrides(base, {"flags.migStrategy": None}) == base


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("1", True), ("False", False), ("0", False), ("no", False), ("YES", True)],
)
def test_environment_booleans(text: str, expected: bool) -> None:
    config = apply_overrides(parse_config(""), {"flags.plugin.passDeviceSpecs": text})
    assert config.flags.plugin.pass_device_specs is expected


def test_typed_values_from_the_cli() -> None:
    config = apply_overrides(
        parse_config(""),
        {
            "flags.gdsEnabled": True,
            "flags.plugin.deviceListStrategy": ["envvar", "cdi-cri"],
            "imex.channelIDs": [0],
        },
    )
    assert config.flags.gds_enabled is True
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-cri")
    assert config.imex.channel_ids == (0,)


def test_comma_separated_environment_lists() -> None:
    config = apply_overrides(
        parse_config(""),
        {"flags.plugin.deviceListStrategy": "envvar, cdi-annotations", "imex.channelIDs": "0"},
    )
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-annotations")
    assert config.imex.channel_ids == (0,)


def test_a_bad_value_names_nvidias_flag_and_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(parse_config(""), {"flags.migStrategy": "double"})
    (problem,) = caught.value.problems
    assert problem.path == "flags.migStrategy (set by --mig-strategy / MIG_STRATEGY)"
    assert "invalid value 'double'" in problem.message
    assert "'none', 'single' or 'mixed'" in problem.message


def test_an_explicit_origin_is_used() -> None:
    with pytest.raises(ConfigError, match=r"\(set by GPUSLICE_POLICY\)"):
        apply_overrides(
            parse_config(""),
            {"flags.plugin.sharedDevicesAllocationPolicy": Override("spread", "GPUSLICE_POLICY")},
        )
    with pytest.raises(ConfigError, match=r"\(set by --pass-device-specs\): expected true or"):
        apply_overrides(
            parse_config(""), {"flags.plugin.passDeviceSpecs": ("maybe", "--pass-device-specs")}
        )


def test_a_list_field_given_a_tuple_of_values_is_not_mistaken_for_an_origin() -> None:
    config = apply_overrides(
        parse_config(""), {"flags.plugin.deviceListStrategy": ("envvar", "cdi-cri")}
    )
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-cri")


def test_unknown_override_path_suggests_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(parse_config(""), {"flags.migStrategie": "none", "nope.x": 1})
    messages = [str(p) for p in caught.value.problems]
    assert messages[0].startswith("flags.migStrategie (set by")
    assert "did you mean 'migStrategy'?" in messages[0]
    assert messages[1].startswith("nope.x (set by")


def test_override_that_conflicts_with_the_file_is_refused() -> None:
    mps = parse_config("sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n")
    with pytest.raises(ConfigError, match=r"flags\.migStrategy \(set by --mig-strategy"):
        apply_overrides(mps, {"flags.migStrategy": "mixed"})


def test_mps_root_from_the_environment_reaches_allocate_settings() -> None:
    mps = parse_config("sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 4\n")
    assert allocate_settings(mps).mps_root == "/run/nvidia/mps"
    moved = apply_overrides(mps, {"flags.mpsRoot": "/var/run/mps"})
    assert allocate_settings(moved).mps_root == "/var/run/mps"


def test_allocate_settings_resolve_roots_and_flags() -> None:
    config = parse_config(
        "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n  gdrcopyEnabled: true\n"
        "  plugin:\n    deviceListStrategy: [cdi-cri, envvar, cdi-cri]\n"
        "    deviceIDStrategy: index\n    passDeviceSpecs: true\n"
        "    cdiAnnotationPrefix: example.com/\n    sharedDevicesAllocationPolicy: packed\n"
    )
    settings = allocate_settings(config)
    assert settings.nvidia_dev_root == "/run/nvidia/driver"
    assert settings.device_list_strategies == ("cdi-cri", "envvar")
    assert settings.device_id_strategy == "index"
    assert settings.pass_device_specs is True
    assert settings.cdi_annotation_prefix == "example.com/"
    assert settings.allocation_policy == "packed"
    assert (settings.gdrcopy_enabled, settings.gds_enabled, settings.mofed_enabled) == (
        True,
        False,
        False,
    )
    dev_root = apply_overrides(config, {"flags.nvidiaDevRoot": "/"})
    assert allocate_settings(dev_root).nvidia_dev_root == "/"
