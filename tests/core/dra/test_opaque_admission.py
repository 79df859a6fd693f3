"""The chart's claim-config admission policy is generated from the kinds' registry
(`core.dra.opaque.admission`, `scripts/gen-claim-policy`): the committed template is the
registry's, and a field the generator cannot read is an error naming it, never a field
admission silently lets through."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import Field, field_validator

from gpuslice.core.dra.opaque.admission import TEMPLATE, NotDerivable, _folded, policy_template
from gpuslice.core.dra.opaque.base import GUARD, GuardSlot, OpaqueKind, StrictModel
from gpuslice.core.dra.opaque.registry import KINDS

ROOT = Path(__file__).parents[3]


def test_the_committed_policy_is_what_the_registry_generates() -> None:
    assert (ROOT / TEMPLATE).read_text() == policy_template(), (
        f"{TEMPLATE} is stale: run scripts/gen-claim-policy"
    )
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-claim-policy"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr


def test_the_policy_names_every_registered_kind_with_its_fields() -> None:
    text = policy_template()
    for kind in KINDS:
        assert f"'{kind.api_version} {kind.kind}': ['apiVersion', 'kind'," in text
        assert f"- name: of{kind.kind}\n" in text


def _kind(model: type[StrictModel]) -> OpaqueKind[Any, GuardSlot]:
    return OpaqueKind(
        api_version="resource.example.com/v1",
        kind="Odd",
        model=model,
        slot=GUARD,
        fits=frozenset({"gpu"}),
        contribute=lambda cfg, source: GuardSlot(),
    )


class _Base(StrictModel):
    api_version: Literal["resource.example.com/v1"] = Field(alias="apiVersion")
    kind: Literal["Odd"]


class _LaxInt(_Base):
    count: int | None = None


class _LaxBool(_Base):
    on: bool = False


class _Nested(_Base):
    inner: _LaxInt | None = None


class _Bounded(_Base):
    name: str | None = Field(None, max_length=8)


class _Validated(_Base):
    name: str | None = None

    @field_validator("name")
    @classmethod
    def _lower(cls, v: str | None) -> str | None:
        if v is not None and v != v.lower():
            raise ValueError("lower case")
        return v


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (_LaxInt, "Odd.count: an int the model reads from '50'; use JsonInt"),
        (_LaxBool, "Odd.on: a bool the model reads from 1 or 'yes'; use StrictBool"),
        (_Nested, "Odd.inner: not a scalar the generator reads; give its CEL (Admission)"),
        (_Bounded, "Odd.name: a constraint the generator does not translate"),
        (_Validated, "Odd.name: a field validator; give its CEL (Admission)"),
    ],
)
def test_a_field_admission_cannot_check_as_prepare_reads_it_is_an_error(
    model: type[StrictModel], says: str
) -> None:
    """Prepare would take `"50"` for a plain int and `1` for a plain bool, where the API
    server's CEL sees a string and a number: the generator refuses rather than disagree."""
    with pytest.raises(NotDerivable, match=re.escape(says)):
        policy_template((*KINDS, _kind(model)))


@pytest.mark.parametrize(
    "text",
    [
        "a" * 200,
        "x  y  " * 30,
        r"'^[ \t\n\r\f\v]*[0-9]+([.][0-9]+)?[ \t\n\r\f\v]*([KMGTPE]i?|k)?[ \t\n\r\f\v]*$'",
        "a # not a comment: b - c " * 10,
    ],
)
def test_folded_text_reads_back_as_written(text: str) -> None:
    block = _folded("expression", text, 6, first="- ")
    assert yaml.safe_load(block)[0] == {"expression": text}
