"""Where a test lives: the rule `tests/packaging/test_tests_mirror_src.py` enforces and
`scripts/house-counts` counts.

A unit test of `gpuslice/<path>` (a package, or a module `<path>.py`) lives in
`tests/<path>/`, so the tests of a module are found from its name and a module that moves
takes its tests' directory with it. The tiers below test the whole (a daemon, a cluster, an
image, the docs, the chart, the package) rather than one room, and are named for the tier;
a directory without Python files (`tests/configs`: inputs) holds data, not tests."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "src" / "gpuslice"

WHOLE_TIERS = frozenset(
    {
        "bench",
        "chart",
        "docs",
        "e2e",
        "e2e_dra",
        "faults",
        "image",
        "packaging",
        "real_k8s",
        "real_node",
    }
)


def mirrors_src(rel: Path) -> bool:
    """Whether `tests/<rel>` is an exempt tier or names a package or module of gpuslice."""
    if rel.parts[0] in WHOLE_TIERS:
        return True
    return (PACKAGE / rel).is_dir() or (PACKAGE / rel).with_suffix(".py").is_file()


def unmirrored_test_dirs() -> list[str]:
    """The directories under tests/ holding Python files that break the rule."""
    dirs = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(
        str(d.relative_to(TESTS.parent))
        for d in dirs
        if d != TESTS and not mirrors_src(d.relative_to(TESTS))
    )
