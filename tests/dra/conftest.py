"""DRA fixtures: a driver server and an emulated kubelet on real sockets in a short temp dir."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuslice.dra.server import DraPluginServer, DraServerSettings
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator
from tests.dra.dra_doubles import DRIVER, RecordingPreparer


@pytest.fixture
def registry_dir(sock_dir: Path) -> Path:
    path = sock_dir / "reg"
    path.mkdir()
    return path


@pytest.fixture
def plugin_dir(sock_dir: Path) -> Path:
    return sock_dir / "plug"


@pytest.fixture
def preparer() -> RecordingPreparer:
    return RecordingPreparer()


@pytest.fixture
async def server(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer
) -> AsyncIterator[DraPluginServer]:
    settings = DraServerSettings(check_tick_s=0.5)
    async with DraPluginServer(
        DRIVER, plugin_dir, registry_dir, preparer, settings=settings
    ) as running:
        yield running


@pytest.fixture
async def kubelet(registry_dir: Path) -> AsyncIterator[DraKubeletEmulator]:
    emulator = DraKubeletEmulator(registry_dir, tick_s=0.5)
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()
