"""The node lock on real files: one holder at a time (two open files in one process conflict
as two processes do), who holds it is readable, a child process never keeps it, and what is
at the path that is not a plain file is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.host.hostdirs import HostDirError
from gpuslice.host.nodelock import LOCK_NAME, MAX_HOLDER_BYTES, NodeLock


def test_one_holder_at_a_time_and_the_next_takes_it_on_release(tmp_path: Path) -> None:
    first, second = NodeLock(tmp_path / LOCK_NAME), NodeLock(tmp_path / LOCK_NAME)
    assert first.try_acquire("pid=1 pod=ns/a")
    assert not second.try_acquire("pid=2 pod=ns/b")
    assert second.holder() == "pid=1 pod=ns/a"
    first.release()
    assert second.try_acquire("pid=2 pod=ns/b")
    assert first.holder() == "pid=2 pod=ns/b"
    assert not first.try_acquire("pid=1 pod=ns/a")
    second.release()


def test_a_child_process_does_not_keep_the_node_locked(tmp_path: Path) -> None:
    """An MPS control daemon started by the agent outlives it on purpose; it must not hold
    the node for the agent's successor."""
    lock = NodeLock(tmp_path / LOCK_NAME)
    assert lock.try_acquire("pid=1")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        close_fds=False,  # whatever is inheritable goes to the child
    )
    try:
        # once it runs its own code, its exec is complete (the kernel lets a vfork
        # parent go on a moment before it closes the child's close-on-exec files)
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        lock.release()
        assert NodeLock(tmp_path / LOCK_NAME).try_acquire("pid=2")
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
        assert child.stdout is not None
        child.stdout.close()


def test_holder_is_one_printable_line_of_bounded_size(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    path.write_bytes(b"pid=7\x1b[31m red\nsecond line\n" + b"x" * (4 * MAX_HOLDER_BYTES))
    assert NodeLock(path).holder() == "pid=7[31m red"
    assert NodeLock(tmp_path / "absent").holder() == ""


def test_a_symlink_or_a_directory_at_the_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("", encoding="utf-8")
    link = tmp_path / LOCK_NAME
    link.symlink_to(target)
    with pytest.raises(HostDirError, match=rf"node lock {link}: .*ELOOP"):
        NodeLock(link).try_acquire("pid=1")
    os.unlink(link)
    link.mkdir()
    with pytest.raises(HostDirError, match=rf"node lock {link}"):
        NodeLock(link).try_acquire("pid=1")
