"""Property: whatever text or bytes reach the config loader, the only exception out of it
is the project's ConfigError. Deterministic (derandomized) and modest, so CI stays fast."""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.core.config import parse_config
from gpuslice.core.errors import ConfigError
from gpuslice.host.configfiles import read_configs

FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

KEYS = st.sampled_from(
    [
        "version",
        "flags",
        "sharing",
        "timeSlicing",
        "mps",
        "resources",
        "name",
        "replicas",
        "rename",
        "devices",
        "migStrategy",
        "plugin",
        "gfd",
        "imex",
        "renameByDefault",
        "failRequestsGreaterThanOne",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["v1", "nvidia.com/gpu", "all", "none", "single", "mixed", "2001-02-30"]),
)
DOCS = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4)
    ),
    max_leaves=25,
)
TOKENS = st.sampled_from(
    [
        "version: v1\n",
        "sharing:\n",
        "  timeSlicing:\n",
        "    resources:\n",
        "- ",
        "  ",
        "&a ",
        "*a ",
        "[",
        "]",
        "{",
        "}",
        ": ",
        "\n",
        "!!int ",
        "!!binary ",
        "2001-02-30",
        "9" * 50,
        "'",
        '"',
        "#",
        "---\n",
        "...\n",
        "? ",
        "|\n",
        ">\n",
        "\t",
        "\x00",
        "\ufeff",
    ]
)


def _rejects_only_with_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_config(text)


@FUZZ
@given(DOCS)
def test_structured_documents(doc: object) -> None:
    _rejects_only_with_config_error(yaml.safe_dump(doc))
    _rejects_only_with_config_error(yaml.safe_dump({"version": "v1", "sharing": doc}))


@FUZZ
@given(st.lists(TOKENS, max_size=40).map("".join))
def test_yaml_token_soup(text: str) -> None:
    _rejects_only_with_config_error(text)


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    _rejects_only_with_config_error(text)


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_from_a_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    try:
        named = read_configs(path)
        for name, text in named.texts.items():
            with contextlib.suppress(ConfigError):
                parse_config(text, source=name)
    except ConfigError:
        pass
