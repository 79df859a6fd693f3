"""The config watch that lets the reload loop sleep: it wakes for an in-place edit, a
ConfigMap-style `..data` symlink swap, a new file in a directory of named configs and a
change where a symlinked path points, and stays asleep while nothing changes. (That the
daemon then reloads is tested end to end in tests/e2e/test_daemon.py, whose waits are
shorter than the safety-net rescan.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gpuslice.agent.config_watch import ConfigWatch, watched_directories
from gpuslice.aio.dirwatch import DirWatch
from gpuslice.testing.eventually import eventually

WAIT_S = 10.0


def test_a_file_is_watched_in_its_directory(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    assert watched_directories(config) == [tmp_path]


def test_a_directory_of_named_configs_is_watched_itself(tmp_path: Path) -> None:
    assert watched_directories(tmp_path) == [tmp_path]


def test_a_symlinked_file_is_watched_where_it_points_too(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "config.yaml").write_text("version: v1\n")
    (tmp_path / "mount").mkdir()
    link = tmp_path / "mount" / "config.yaml"
    link.symlink_to(tmp_path / "real" / "config.yaml")
    assert watched_directories(link) == [tmp_path / "mount", tmp_path / "real"]


def test_a_symlink_loop_is_watched_in_its_own_directory(tmp_path: Path) -> None:
    loop = tmp_path / "config.yaml"
    loop.symlink_to(tmp_path / "config.yaml")
    assert watched_directories(loop) == [tmp_path]


async def _woken(watch: ConfigWatch, within_s: float) -> bool:
    try:
        await asyncio.wait_for(watch.wait(), within_s)
    except TimeoutError:
        return False
    return True


@pytest.fixture
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory apart from the watched ones, for `_woken_wrongly`'s probe."""
    return tmp_path_factory.mktemp("probe")


async def _woken_wrongly(watch: ConfigWatch, probe_dir: Path) -> bool:
    """Whether the watch holds a change once the event loop has read every inotify event
    already queued. A wrong wake-up comes from such an event, so instead of giving it time,
    a probe watch on another directory gets an event queued after it: once the loop has
    read the probe's, it has read the watch's too (one epoll wait reports every ready
    descriptor, and their callbacks run in the same round)."""
    probe = DirWatch.open(probe_dir)
    assert probe is not None
    try:
        (probe_dir / "marker").touch()
        await eventually(probe.changed.is_set, "the probe's inotify event read")
        return watch.pending
    finally:
        probe.close()


@pytest.fixture
def configmap(tmp_path: Path) -> Path:
    """A ConfigMap volume as the kubelet lays it out: `config.yaml -> ..data/config.yaml`,
    `..data -> ..<timestamp>`."""
    (tmp_path / "..v1").mkdir()
    (tmp_path / "..v1" / "config.yaml").write_text("version: v1\n")
    (tmp_path / "..data").symlink_to("..v1")
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    return tmp_path / "config.yaml"


async def test_nothing_changes_nothing_wakes(configmap: Path, probe_dir: Path) -> None:
    watch = ConfigWatch(configmap)
    try:
        assert watch.armed
        assert not await _woken_wrongly(watch, probe_dir)
    finally:
        watch.close()


async def test_a_configmap_update_wakes_the_watch(configmap: Path) -> None:
    watch = ConfigWatch(configmap)
    try:
        root = configmap.parent
        (root / "..v2").mkdir()
        (root / "..v2" / "config.yaml").write_text("version: v1\nflags: {}\n")
        (root / "..data_tmp").symlink_to("..v2")
        os.rename(root / "..data_tmp", root / "..data")  # the kubelet's atomic swap
        assert await _woken(watch, WAIT_S)
        watch.clear()
        watch.rearm()  # ..data now points at ..v2: watched there from now on
        assert watched_directories(configmap) == [root, root / "..v2"]
        (root / "..v2" / "config.yaml").write_text("version: v1\n")  # edited in place
        assert await _woken(watch, WAIT_S)
    finally:
        watch.close()


async def test_an_edit_in_place_wakes_the_watch(tmp_path: Path, probe_dir: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    watch = ConfigWatch(config)
    try:
        with config.open("a") as f:
            f.write("# edited\n")
        assert await _woken(watch, WAIT_S)
        watch.clear()
        assert not await _woken_wrongly(watch, probe_dir)
    finally:
        watch.close()


async def test_a_new_named_config_wakes_the_watch(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("version: v1\n")
    watch = ConfigWatch(tmp_path)
    try:
        (tmp_path / "b").write_text("version: v1\n")
        assert await _woken(watch, WAIT_S)
    finally:
        watch.close()


async def test_a_missing_directory_is_not_armed_until_it_exists(tmp_path: Path) -> None:
    config = tmp_path / "later" / "config.yaml"
    watch = ConfigWatch(config)
    try:
        assert not watch.armed  # the reload loop then polls, as it did before
        (tmp_path / "later").mkdir()
        watch.rearm()
        assert watch.armed
        config.write_text("version: v1\n")
        assert await _woken(watch, WAIT_S)
    finally:
        watch.close()
