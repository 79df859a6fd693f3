"""The image is built once per run (tests/conftest.py `gpuslice_image`: scripts/build-image,
shared with the chart's real-node tier) and its size and build times are printed at the end
of the run, where CI logs keep them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.testing.image import Buildah, ImageConfig, Runc, default_cache


@pytest.fixture(scope="module")
def buildah(gpuslice_image: str) -> Buildah:
    # Kept between runs, so the base made by mmdebstrap is imported once.
    return Buildah(default_cache() / "storage")


@pytest.fixture(scope="module")
def image(buildah: Buildah, gpuslice_image: str) -> str:
    return gpuslice_image


@pytest.fixture(scope="module")
def image_config(buildah: Buildah, image: str) -> ImageConfig:
    return buildah.inspect(image)


@pytest.fixture(scope="module")
def rootfs(buildah: Buildah, image: str) -> Iterator[Path]:
    with buildah.rootfs(image) as path:
        yield path


@pytest.fixture
def runc(tmp_path: Path) -> Runc:
    return Runc(tmp_path / "runc-state")
