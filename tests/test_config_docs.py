"""`docs/configuration.md` lists the deliberate differences from NVIDIA; each item must name
the test that holds it, and that test must exist, so the list cannot drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "configuration.md"
MARKER = re.compile(r"\[test: (?P<path>tests/[\w/]+\.py)::(?P<name>\w+)\]")


def _section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Where gpuslice differs from NVIDIA")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _items(section: str) -> list[str]:
    """Each `- ` bullet with its continuation lines."""
    items: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            items.append(line)
        elif items and line.startswith("  "):
            items[-1] += " " + line.strip()
    return items


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_listed_difference_names_an_existing_test() -> None:
    items = _items(_section())
    assert len(items) >= 10
    for item in items:
        found = MARKER.search(item)
        assert found is not None, f"no [test: ...] marker in: {item[:80]}"
        path = ROOT / found["path"]
        assert path.is_file(), f"{found['path']} does not exist (item: {item[:60]})"
        assert found["name"] in _test_names(path), f"{found['name']} not in {found['path']}"
