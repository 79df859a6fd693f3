"""Named-config selection: NVIDIA config-manager's order and messages (REFERENCE §7)."""

from __future__ import annotations

import pytest

from gpuslice.core.config.selection import Selection, select_config
from gpuslice.core.errors import ConfigError

HELM_FALLBACKS = ["named", "single"]
LABEL = "nvidia.com/device-plugin.config"


def test_label_value_wins_over_default() -> None:
    got = select_config(["default", "a100", "ls40"], "a100", "default", HELM_FALLBACKS)
    assert got == Selection("a100", "label")


def test_default_used_when_label_unset() -> None:
    got = select_config(["default", "a100"], "", "a100", HELM_FALLBACKS)
    assert got == Selection("a100", "default")


def test_configmap_internals_are_not_configs() -> None:
    got = select_config(["..data", "..2024_06_11_14_13_34.1", "only"], "", "", ["single"])
    assert got == Selection("only", "single")


def test_named_fallback_picks_default_file() -> None:
    assert select_config(["default", "x"], "", "", ["named", "single"]) == Selection(
        "default", "named"
    )


def test_single_fallback_needs_exactly_one_file() -> None:
    with pytest.raises(ConfigError, match="all fallbacks failed"):
        select_config(["a", "b"], "", "", ["single"])


def test_fallbacks_tried_in_order() -> None:
    assert select_config(["default"], "", "", ["single", "named"]) == Selection("default", "single")


def test_empty_fallback_gives_the_empty_config() -> None:
    got = select_config(["a", "b"], "", "", ["named", "single", "empty"])
    assert got.empty
    assert got.name is None


def test_unknown_label_value_names_label_and_known_configs() -> None:
    with pytest.raises(ConfigError) as info:
        select_config(["a100", "ls40"], "h100", "", HELM_FALLBACKS, label=LABEL)
    text = str(info.value)
    assert "specified config h100 does not exist" in text
    assert f"{LABEL}=h100" in text
    assert "a100, ls40" in text


def test_missing_default_is_named() -> None:
    with pytest.raises(ConfigError, match="specified config gone does not exist"):
        select_config(["a"], "", "gone", HELM_FALLBACKS)


def test_no_files() -> None:
    with pytest.raises(ConfigError, match="no configuration files available"):
        select_config(["..data"], "", "", ["empty"])


def test_unknown_fallback_is_rejected_with_accepted_values() -> None:
    with pytest.raises(ConfigError) as info:
        select_config(["a"], "a", "", ["named", "nameed"])
    assert "unknown fallback strategy: nameed" in str(info.value)
    assert "named, single, empty" in str(info.value)


def test_all_fallbacks_failed_message() -> None:
    with pytest.raises(ConfigError) as info:
        select_config(["a", "b"], "", "", HELM_FALLBACKS, label="example.com/cfg")
    text = str(info.value)
    assert "no config was set, no default was provided, and all fallbacks failed" in text
    assert "example.com/cfg" in text


def test_no_fallbacks_at_all() -> None:
    with pytest.raises(ConfigError, match="all fallbacks failed"):
        select_config(["default"], "", "", [])
