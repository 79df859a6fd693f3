"""docs/choosing-a-mode.md (issue 43 item 10): its numbers are the ones its sources hold, its
pictures are what `scripts/docs-pictures` draws, and the leak it pictures is the default
demo's own."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from gpuslice.core.gpumodels import MODELS
from gpuslice.demo.scenario import run_demo

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "choosing-a-mode.md"


def _pictures() -> ModuleType:
    path = ROOT / "scripts" / "docs-pictures"
    loader = importlib.machinery.SourceFileLoader("docs_pictures", str(path))
    spec = importlib.util.spec_from_loader("docs_pictures", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_pictures"] = module
    loader.exec_module(module)
    return module


def test_the_pictures_are_what_the_script_draws() -> None:
    pictures = _pictures()
    images = ROOT / "docs" / "images"
    assert (images / "deployment.svg").read_text() == pictures.deployment_svg()
    assert (images / "guard-timeline.svg").read_text() == pictures.timeline_svg(
        pictures.demo_story()
    )
    text = PAGE.read_text()
    assert "](images/deployment.svg)" in text
    assert "](images/guard-timeline.svg)" in text
    assert "docs/choosing-a-mode.md" in (ROOT / "README.md").read_text()


async def test_the_pictured_leak_is_the_default_demos() -> None:
    pictured = _pictures().demo_story()
    shown = (await run_demo()).memory
    assert shown is not None
    for run in ("nvidia", "guard", "caps"):
        assert getattr(pictured, run).fates == getattr(shown, run).fates
        assert getattr(pictured, run).events == getattr(shown, run).events
    assert (pictured.total_mib, pictured.replicas) == (shown.total_mib, shown.replicas)


def _mig_loss(key: str, profile: str) -> tuple[str, int, int]:
    model = MODELS[key]
    assert model.mig is not None
    [p] = [p for p in model.mig.profiles if p.name == profile]
    lost = 1 - 7 * p.memory_mib / model.memory_mib
    return (
        f"{100 * lost:.1f} %",
        model.multiprocessors - 7 * p.multiprocessors,
        model.multiprocessors,
    )


def test_the_numbers_are_their_sources() -> None:
    text = PAGE.read_text()
    guard = (ROOT / "docs" / "memory-guard.md").read_text()
    measured = guard.split("### The measured difference", 1)[1]
    for figure in ("3.8 % (61 of 1,612)", "0.2 % (3)", "0.0 % (0)", "421"):
        assert figure in measured, figure
    for figure in ("**3.8 %** (61 of 1,612)", "**0.2 %** (3)", "421 leakers stopped"):
        assert figure in text, figure

    share, sms, total = _mig_loss("h100-80gb", "1g.10gb")
    assert f"**{share}** of an H100 80GB's memory and {sms} of its {total} SMs" in text
    share, sms, total = _mig_loss("a100-80gb", "1g.10gb")
    assert f"**{share}** and {sms} of {total} SMs on an A100 80GB" in text

    bench = (ROOT / "bench" / "README.md").read_text()
    for figure in ("0.050 % of a core", "65.3 MiB", "10.1 wake-ups/s", "**37x**",
                   "p50 1.22x", "5.00x the slices", "1.58x the real scheduler"):  # fmt: skip
        assert figure in bench, figure
    advise = (ROOT / "docs" / "advise.md").read_text()
    assert "28.8 s, **15.5x**" in advise
    for figure in ("**0.050 %**", "**65.3 MiB**", "**10.1**", "**37x**", "**1.22x**",
                   "**5.00x**", "**1.58x**", "**28.8 s**, **15.5x**"):  # fmt: skip
        assert figure in text, figure


def test_on_a_real_gpu_is_a_placeholder_that_says_so() -> None:
    section = PAGE.read_text().split("## On a real GPU", 1)[1]
    assert section.lstrip().startswith("Not measured yet.")
    rows = [line for line in section.splitlines() if line.startswith("| ") and "x4" in line]
    assert rows
    assert all("not measured yet" in row for row in rows)
