"""Issue 42 item 8: the tests mirror src/. Every directory of unit tests names the gpuslice
package or module it tests, or is one of the tiers that test the whole (`tests/layout.py`
holds the rule; `scripts/mirror-tests` moves a directory that breaks it)."""

from __future__ import annotations

from pathlib import Path

from tests.layout import WHOLE_TIERS, mirrors_src, unmirrored_test_dirs


def test_every_unit_test_directory_mirrors_a_package_of_src() -> None:
    assert unmirrored_test_dirs() == []


def test_the_rule_takes_packages_modules_and_tiers_only() -> None:
    assert mirrors_src(Path("core/dra"))  # a package
    assert mirrors_src(Path("agent/dra_slices"))  # a module
    assert mirrors_src(Path("e2e_dra/anything"))  # inside a tier
    assert not mirrors_src(Path("dra_core"))
    assert not mirrors_src(Path("core/nothing_of_that_name"))


def test_every_exempt_tier_exists() -> None:
    """A tier renamed or removed must leave the list, so it exempts nothing by accident."""
    tests = Path(__file__).resolve().parents[1]
    assert sorted(t for t in WHOLE_TIERS if not (tests / t / "__init__.py").is_file()) == []
