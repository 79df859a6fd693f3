"""The image is built once per run (scripts/build-image, a minute or two on a CI machine)
and its size and build times are printed at the end of the run, where CI logs keep them."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslice.testing.image import BASE_UNAVAILABLE, Buildah, ImageConfig, Runc, default_cache

REPORT = pytest.StashKey[list[str]]()


def _why_not() -> str | None:
    if os.name != "posix" or os.uname().sysname != "Linux":
        return "the image tests need Linux"
    if os.geteuid() != 0:
        return "buildah (chroot isolation) and runc need root here"
    for tool, package in (("buildah", "buildah"), ("runc", "runc"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; scripts/check installs it)"
    return None


def report(config: pytest.Config, line: str) -> None:
    config.stash.setdefault(REPORT, []).append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(REPORT, [])
    if lines:
        terminalreporter.section("the gpuslice image")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def buildah() -> Buildah:
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    # Kept between runs, so the base made by mmdebstrap is imported once.
    return Buildah(default_cache() / "storage")


@pytest.fixture(scope="module")
def image(buildah: Buildah, request: pytest.FixtureRequest) -> Iterator[str]:
    tag = f"localhost/gpuslice:test-{uuid.uuid4().hex[:12]}"
    done = buildah.build(tag)
    said = [line for line in done.stderr.splitlines() if line.startswith("build-image:")]
    if done.returncode == BASE_UNAVAILABLE:
        pytest.skip(said[-1] if said else done.stderr.strip()[-500:])
    assert done.returncode == 0, f"scripts/build-image failed:\n{done.stderr[-6000:]}"
    for line in said:
        report(request.config, line)
    try:
        yield tag
    finally:
        buildah("rmi", tag)


@pytest.fixture(scope="module")
def image_config(buildah: Buildah, image: str) -> ImageConfig:
    return buildah.inspect(image)


@pytest.fixture(scope="module")
def rootfs(buildah: Buildah, image: str) -> Iterator[Path]:
    with buildah.rootfs(image) as path:
        yield path


@pytest.fixture
def report_line(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to what the run prints about the image at its end."""
    return lambda line: report(request.config, line)


@pytest.fixture
def runc(tmp_path: Path) -> Runc:
    return Runc(tmp_path / "runc-state")
