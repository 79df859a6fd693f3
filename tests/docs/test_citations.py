"""Every peer issue or PR the docs and docstrings cite is one we checked (issue 33: a cited
number could not be found). A citation is `owner/repo#N`; a bare `#N` belongs to the last
repository named before it in the same paragraph, and one with none is an error."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "docs/reference/citations.md"
CITATION = re.compile(r"(?:([\w.-]+/[\w.-]+)|(?<![\w&]))#(\d+)\b")


def cited_in(text: str) -> tuple[set[str], list[str]]:
    """The `owner/repo#N` cited in `text`, and the bare `#N` that name no repository."""
    cited: set[str] = set()
    unnamed: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        repo = None
        for match in CITATION.finditer(paragraph):
            repo = match.group(1) or repo
            if repo is None:
                unnamed.append(match.group(0))
            else:
                cited.add(f"{repo}#{match.group(2)}")
    return cited, unnamed


def listed() -> set[str]:
    """The threads in the first column of the list's table."""
    rows = [line for line in LIST.read_text().splitlines() if line.startswith("| ")]
    return {c for row in rows for c in cited_in(row.split("|")[1])[0]}


def citing_files() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.md") if p != LIST]
    return [*docs, ROOT / "README.md", ROOT / "bench/README.md", *(ROOT / "src").rglob("*.py")]


def test_the_list_is_read() -> None:
    assert "kubernetes-sigs/dra-driver-nvidia-gpu#1100" in listed()
    assert cited_in("NVIDIA's own (its #719).")[1] == ["#719"]
    assert cited_in("a/b#1, #2\n\n#3")[0] == {"a/b#1", "a/b#2"}


def test_every_cited_thread_is_in_the_list_of_checked_threads() -> None:
    known = listed()
    problems: list[str] = []
    for path in citing_files():
        cited, unnamed = cited_in(path.read_text())
        name = path.relative_to(ROOT)
        problems += [f"{name}: {c} is not in {LIST.name}" for c in sorted(cited - known)]
        problems += [f"{name}: {c} names no repository" for c in unnamed]
    assert not problems, "\n".join(problems)
