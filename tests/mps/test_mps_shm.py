"""Each MPS daemon's shm directory (its clients' `/dev/shm`, mounted read-write into MPS pods)
is a size-limited tmpfs while the daemon runs, as NVIDIA's DRA driver mounts it: a tenant
writing there fills memory charged to its own pod, up to the mount's size, instead of the
node's disk. Real mounts (the CI runs as root); where this process may not mount, the test
says so and skips. Where the mount could not reach the pods it is not made, and the manager
says why once."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpuslice.core.mps import MpsDaemonSpec, daemon_spec
from gpuslice.mps import ControlProgram, MpsDaemonManager
from gpuslice.mps.shm import ShmMounts, unmount

from .conftest import FAKE_CONTROL, gpu, shared, wait_until
from .test_mps_manager import FAST, running

SIZE = 1024 * 1024


def spec_in(root: Path, name: str, index: int) -> MpsDaemonSpec:
    spec = daemon_spec(shared([gpu(index)], 2, name=name), str(root))
    assert spec is not None
    return spec


def tmpfs_options(directory: str) -> str | None:
    """The super-block and mount options of the tmpfs on `directory`, None when none is."""
    path = os.path.realpath(directory)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if fields[4] == path and tail.split()[0] == "tmpfs":
            return f"{fields[5]},{tail.split()[2]}"
    return None


def manager_with(
    specs: list[MpsDaemonSpec], shm: ShmMounts | None, *, keep_running: bool = False
) -> MpsDaemonManager:
    return MpsDaemonManager(
        specs,
        ControlProgram.factory(FAKE_CONTROL, timeout_s=10.0, quit_grace_s=1.0),
        timings=FAST,
        shm=shm,
        keep_running=keep_running,
    )


@pytest.fixture
def mountable(sock_dir: Path) -> Path:
    """A directory this process may mount a tmpfs on (else the test is skipped)."""
    probe = sock_dir / "probe"
    probe.mkdir()
    why = ShmMounts(SIZE, host_namespace=True).mount(str(probe))
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs here: {why}")
    assert unmount(str(probe)) is None
    return sock_dir


async def test_a_daemons_shm_is_a_bounded_tmpfs_while_it_runs(mountable: Path) -> None:
    """Device-plugin mode: one shm directory for every resource's daemon. It is mounted
    for the first, kept for the second, and unmounted once neither runs."""
    first, second = spec_in(mountable, "nvidia.com/gpu", 0), spec_in(mountable, "b.io/gpu", 1)
    assert first.shm_dir == second.shm_dir
    manager = manager_with([first, second], ShmMounts(SIZE, host_namespace=True))
    async with running(manager):
        await wait_until(
            manager, lambda: manager.ready(first.resource) and manager.ready(second.resource), 10
        )
        options = tmpfs_options(first.shm_dir)
        assert options is not None, "no tmpfs on the shm directory"
        assert {"nosuid", "nodev", "noexec", "size=1024k"} <= set(options.split(","))
        with pytest.raises(OSError, match="No space left") as full:  # bounded for a tenant
            (Path(first.shm_dir) / "fill").write_bytes(b"\0" * (2 * SIZE))
        assert full.value.errno == errno.ENOSPC
        await manager.reconfigure([second])  # one daemon left: the mount stays
        assert tmpfs_options(first.shm_dir) is not None
    assert tmpfs_options(first.shm_dir) is None  # both stopped: unmounted
    assert manager.problems == ()


async def test_where_the_mount_would_not_reach_the_pods_it_is_not_made_and_said_once(
    sock_dir: Path,
) -> None:
    """In a container whose plugin directory does not propagate to the host, a tmpfs would
    hide the daemon's `/dev/shm` from its clients': the directory stays plain, the daemon
    runs, and the manager says why (once, not at every restart)."""
    mountinfo = sock_dir / "mountinfo"
    mountinfo.write_text("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n")
    spec = spec_in(sock_dir, "nvidia.com/gpu", 0)
    manager = manager_with([spec], ShmMounts(SIZE, mountinfo=mountinfo, host_namespace=False))
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        assert tmpfs_options(spec.shm_dir) is None
        [problem] = manager.problems
    assert f"MPS shm directory {spec.shm_dir} is left a plain directory" in problem
    assert "mountPropagation Bidirectional" in problem


async def test_a_daemon_left_running_on_a_plain_shm_keeps_it(mountable: Path) -> None:
    """Device-plugin mode after an upgrade: the previous agent's daemon runs on the plain
    shared shm directory, its clients with it. A tmpfs mounted there now would hide their
    files from every client that starts later, so the new agent takes the daemon over, starts
    the other resource's daemon on the directory as it is, and says why."""
    old, new = spec_in(mountable, "nvidia.com/gpu", 0), spec_in(mountable, "b.io/gpu", 1)
    before = manager_with([old], None, keep_running=True)
    async with running(before):
        await wait_until(before, lambda: before.ready(old.resource), 10)
    after = manager_with([old, new], ShmMounts(SIZE, host_namespace=True), keep_running=True)
    try:
        async with running(after):
            await wait_until(
                after, lambda: after.ready(old.resource) and after.ready(new.resource), 10
            )
            assert tmpfs_options(old.shm_dir) is None
            [problem] = after.problems
            assert f"the MPS daemon of {old.resource} runs on it as it is" in problem
    finally:
        for spec in (old, new):  # the test's cleanup: no agent follows
            await ControlProgram(
                Path(spec.pipe_dir), Path(spec.log_dir), command=FAKE_CONTROL
            ).send("quit")
