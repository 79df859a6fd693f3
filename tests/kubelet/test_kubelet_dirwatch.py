"""The socket watch wakes on inotify: with both poll intervals at ten minutes, a kubelet
restart and a deleted plugin socket are still noticed (only the directory events can wake
the watch here)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from gpuslice.aio.dirwatch import DirWatch
from tests.kubelet.kubelet_plans import FAST, gpu, inventory, plan, running_node, whole

GPUS = [gpu(0), gpu(1)]
GPU = "nvidia.com/gpu"
NO_POLL = dataclasses.replace(FAST, watch_interval_s=600.0, watched_interval_s=600.0)


async def test_changes_wake_the_watch_without_polling(sock_dir: Path) -> None:
    watch = DirWatch.open(sock_dir)
    assert watch is not None  # Linux: inotify is there, or the daemon polls every 150 ms
    watch.close()
    async with running_node(sock_dir, plan(whole(GPUS)), inventory(GPUS), settings=NO_POLL) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 2, 10)
        await k.restart()
        await k.wait_for(lambda: k.registrations[GPU] == 2 and k.capacity(GPU) == 2, 10)
        (sock_dir / "nvidia-gpu.sock").unlink()
        await k.wait_for(lambda: k.registrations[GPU] == 3 and k.capacity(GPU) == 2, 10)
        assert (sock_dir / "nvidia-gpu.sock").is_socket()


async def test_a_replaced_directory_ends_the_watch_and_rearming_follows_it(
    tmp_path: Path,
) -> None:
    """The slow safety tick no longer has to find a replaced directory: the end of the
    watch is a change, `armed` turns False, and `rearm` watches the new directory."""
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    watch = DirWatch.open(directory)
    assert watch is not None
    try:
        assert watch.armed
        directory.rename(tmp_path / "old")
        await asyncio.wait_for(watch.changed.wait(), 10)
        assert not watch.armed
        watch.changed.clear()
        directory.mkdir()
        watch.rearm()
        assert watch.armed
        (directory / "kubelet.sock").touch()
        await asyncio.wait_for(watch.changed.wait(), 10)
        watch.changed.clear()
        # A second watch on the old directory is the control: the event that would wake a
        # watch left on it is queued at the touch, so by the time the control has read it
        # (and one more turn of the loop), a wrong wake-up would have come too.
        control = DirWatch.open(tmp_path / "old")
        assert control is not None
        try:
            (tmp_path / "old" / "x").touch()  # the old directory, elsewhere now: not watched
            await asyncio.wait_for(control.changed.wait(), 10)
            await asyncio.sleep(0)
        finally:
            control.close()
        assert not watch.changed.is_set()
    finally:
        watch.close()
