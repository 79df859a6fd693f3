"""The NFD label file at shutdown: a write still in flight never lands after the removal."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpuslice.agent.wiring.labels import LabelFileOutput
from gpuslice.host.labelfile import LabelFile

WAIT_S = 10.0


class HeldLabelFile(LabelFile):
    """A label file whose writes wait, once started, until `release` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def write(self, labels: Mapping[str, str]) -> bool:
        self.entered.set()
        self.release.wait(WAIT_S)
        try:
            return super().write(labels)
        finally:
            self.done.set()


async def test_a_write_cut_loose_by_shutdown_does_not_outlive_the_removal(tmp_path: Path) -> None:
    held = HeldLabelFile(tmp_path / "gfd")
    output = LabelFileOutput(lambda: held)
    publishing = asyncio.create_task(output.publish({"nvidia.com/gpu.count": "1"}))
    await asyncio.to_thread(held.entered.wait, WAIT_S)
    publishing.cancel()  # the reload loop's plan hook, cut short by shutdown: its thread runs on
    with pytest.raises(asyncio.CancelledError):
        await publishing
    retracting = asyncio.create_task(output.retract())
    # Give the removal its chance to run ahead of the write (it did before the fix); with
    # the fix it waits for the write, so this wait only decides how the old code fails.
    await asyncio.wait({retracting}, timeout=0.5)
    held.release.set()
    await retracting
    assert await asyncio.to_thread(held.done.wait, WAIT_S)
    assert not held.path.exists()


async def test_no_write_starts_after_the_removal(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    output = LabelFileOutput(lambda: LabelFile(path))
    await output.publish({"nvidia.com/gpu.count": "1"})
    assert path.exists()
    await output.retract()
    assert not path.exists()
    await output.publish({"nvidia.com/gpu.count": "2"})  # a thread started late
    assert not path.exists()
