"""The bad-config corpus: every file must be refused with a ConfigError naming the field.

Each file's first line is `# expect: <text>`; the text must appear in one of the reported
problems, and when it starts with a field path (`a.b[0].c: ...`) that path must be one of
the problems' paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.core.config import parse_config
from gpuslice.core.errors import ConfigError

BAD = Path(__file__).parents[2] / "configs" / "bad"
CASES = sorted(BAD.glob("*.yaml"))


def _expected(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: ...'"
    return first.removeprefix("# expect: ")


def test_the_corpus_has_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_bad_config_is_refused_naming_the_field(path: Path) -> None:
    expected = _expected(path)
    with pytest.raises(ConfigError) as caught:
        parse_config(path.read_text(encoding="utf-8"), source=path.name)
    error = caught.value
    assert error.source == path.name
    assert path.name in str(error)
    rendered = [str(p) for p in error.problems]
    assert any(expected in line for line in rendered), rendered
    field, sep, _ = expected.partition(": ")
    if sep and " " not in field:
        assert field in [p.path for p in error.problems]
