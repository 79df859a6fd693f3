"""`shown`: how a client's string may appear in an error or a key=value log line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslice.core.text import MAX_SHOWN_CHARS, shown, shown_all


def test_device_ids_and_resource_names_pass_unchanged() -> None:
    for value in ("GPU-00000000-aaaa-bbbb-cccc-000000000000::3", "MIG-1g.10gb", "nvidia.com/gpu"):
        assert shown(value) == value


def test_separators_and_control_characters_are_escaped() -> None:
    assert shown("a\nb") == "a\\x0ab"
    assert shown("k=v,w") == "k\\x3dv\\x2cw"
    assert shown("a b") == "a\\x20b"
    assert shown("") == '""'


def test_long_values_are_cut_and_counted() -> None:
    assert shown("x" * 1_000_000) == "x" * MAX_SHOWN_CHARS + f"...(+{1_000_000 - 80}_chars)"


def test_lists_are_cut_and_counted() -> None:
    assert shown_all([str(n) for n in range(20)]) == "0, 1, 2, 3, 4, 5, 6, 7 and 12 more"
    assert shown_all(["a", "a", "b"]) == "a, b"


@given(st.text(max_size=500))
def test_any_value_is_one_bounded_token(value: str) -> None:
    out = shown(value)
    assert out
    assert len(out) <= MAX_SHOWN_CHARS * 10 + 30
    assert not any(c in out for c in " \n\r\t,=\"'") or out == '""'
