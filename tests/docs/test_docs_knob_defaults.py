"""The defaults the docs' tables give for the daemon's knobs are the knobs' own (issue 42
item 7): `docs/configuration.md`'s table of `gpuslice plugin` flags, `docs/dra.md`'s of DRA's and
`docs/memory-guard.md`'s table of the guard's settings against the knob fields (flag,
variable, chart value, default), and `docs/install.md`'s tables of the chart's values that
set a knob against `values.yaml` (which `tests/chart/test_chart_defaults.py` holds to the
knobs). A docs default of 7 against a code default of 1 fails here; `test_docs_match_code.py`
checks the flags and variables both ways."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from gpuslice.agent.knobs import KnobField
from gpuslice.cli.plugin import FIELDS, GROUPS, plugin
from tests.docs.test_docs_match_code import CODE, DOCS, ROOT, plugin_options

VALUES = yaml.safe_load((ROOT / "deploy/helm/gpuslice/values.yaml").read_text())


def _field_of(option: click.Option) -> KnobField:
    return next(f for g in GROUPS for f, o in FIELDS[g] if o is not None and o.name == option.name)


def _cast(option: click.Option, value: Any) -> Any:
    return option.type_cast_value(click.Context(plugin), value)


def _documented(cell: str) -> str:
    """The default a cell gives: its first code span (`''` is the empty string), else its
    text (`on`, `in-cluster`; `—` is none)."""
    found = CODE.findall(cell)
    text = found[0] if found else cell
    return "" if text in ("''", '""', "—") else text


def _same_default(option: click.Option, cell: str) -> bool:
    default = option.default
    if default is None:
        return True  # derived at start (`<device-plugin-path>/kubelet.sock`), said in words
    text = _documented(cell)
    if not text:
        return default in ("", False) or default == ()
    return bool(_cast(option, text) == _cast(option, default))


@pytest.mark.parametrize(
    ("doc", "heading", "least"),
    [("configuration.md", "## `gpuslice plugin` flags", 50), ("dra.md", "## Turning it on", 8)],
)
def test_the_flag_tables_defaults_and_variables_are_the_knobs(
    doc: str, heading: str, least: int
) -> None:
    options = plugin_options()
    compared = 0
    for flags, env, default, *_ in _section_rows(DOCS / doc, heading):
        names = CODE.findall(flags)
        if not names:
            continue
        option = options[names[0]]
        assert CODE.findall(env)[:1] == ([option.envvar] if option.envvar else []), names[0]
        assert _same_default(option, default), (
            f"docs/{doc}: {names[0]} defaults to {default!r}, the knob to {option.default!r}"
        )
        compared += 1
    assert compared >= least


def _guard_flag(cell: str) -> str:
    """`--memory-guard off|observe|enforce` -> --memory-guard; `--[no-]x` -> --x."""
    return CODE.findall(cell)[0].split()[0].replace("[no-]", "")


def test_the_guard_tables_flags_variables_values_and_defaults_are_the_knobs() -> None:
    options = plugin_options()
    rows = _section_rows(DOCS / "memory-guard.md", "### Modes and settings")
    assert len(rows) >= 8
    for flag_cell, env_cell, value_cell, default in rows:
        option = options[_guard_flag(flag_cell)]
        knob = _field_of(option).knob
        assert CODE.findall(env_cell) == [knob.env], flag_cell
        assert f"memoryGuard.{CODE.findall(value_cell)[0]}" == knob.chart, flag_cell
        assert _same_default(option, default), (
            f"docs/memory-guard.md: {flag_cell} defaults to {default!r}, the knob to "
            f"{option.default!r}"
        )


def _section_rows(doc: Path, heading: str) -> list[list[str]]:
    """The cells of every table row in a section, up to the next heading of its level or
    above (`\\|` inside a cell is no separator; `#` lines in code blocks are no headings)."""
    level = len(heading.split()[0])
    lines = doc.read_text().splitlines()
    rows = []
    fenced = False
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    for line in lines[start + 1 :]:
        fenced ^= line.startswith("```")
        found = re.match(r"(#+) ", line)
        if found and not fenced and len(found[1]) <= level:
            break
        if line.startswith("| `"):
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            rows.append([c.strip() for c in cells])
    return rows


def _value_at(dotted: str) -> Any:
    node = VALUES
    for part in dotted.split("."):
        node = node[part]
    return node


def test_the_install_tables_defaults_of_knob_values_are_the_charts() -> None:
    charted = {f.knob.chart for g in GROUPS for f, _ in FIELDS[g] if f.knob.chart}
    rows = _section_rows(DOCS / "install.md", "## Values") + _section_rows(
        DOCS / "install.md", "## DRA mode"
    )
    compared = 0
    for value_cell, default, *_ in rows:
        [name, *_] = CODE.findall(value_cell) or [""]
        if name not in charted:
            continue
        text = _documented(default)
        chart = _value_at(name)
        documented = text if isinstance(chart, str) else yaml.safe_load(text)
        assert documented == chart, (
            f"docs/install.md: {name} defaults to {default!r}, values.yaml to {_value_at(name)!r}"
        )
        compared += 1
    assert compared >= 20


def test_a_wrong_default_in_the_docs_is_caught() -> None:
    """The comparison itself: 7 against a knob default of 1 is a difference."""
    option = plugin_options()["--memory-guard-interval"]
    assert _same_default(option, "`1`")
    assert not _same_default(option, "`7`")
    assert re.fullmatch(r"--\S+", _guard_flag("`--[no-]memory-soft-limits`"))
