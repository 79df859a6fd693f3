"""One agent acts on a node at a time: an exclusive `flock` on a file in a host directory
that every agent of the same mode must share (docs/install.md#one-agent-per-node).

Two agents on one node happen in ordinary operations: a force-deleted pod whose process
lingers, a rollout whose old pod is still terminating, two releases with overlapping node
selectors. Both would take the kubelet sockets back and forth, and in DRA mode serve from
two records and overwrite each other's checkpoint and CDI specs; the kubelet assumes one
owner of its plugin state, as its own checkpoint manager is one.

`flock`, not `fcntl`/`lockf` record locks: a record lock is dropped when the process closes
*any* descriptor of the file, a flock only when its own open file description goes, which
the kernel does when the process dies, SIGKILL included. So there is never a stale lock to
clean up, and the file itself is never removed (removing it would let a waiter lock an
unlinked file while a third agent locks a new one). The descriptor is not inheritable
(`O_CLOEXEC`): a child such as an MPS control daemon, which outlives the agent on purpose,
must not keep the node locked after the agent is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from gpuslice.host.hostdirs import HostDirError, os_error_text

LOCK_NAME = "gpuslice.lock"
MAX_HOLDER_BYTES = 512
"""What a holder writes is one short line; more is not ours and is not read."""


class NodeLock:
    """The node's lock file; `try_acquire` until it is held, then hold it for the
    process's life (or `release` it once everything it guards is put away)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, holder: str) -> bool:
        """Take the lock without waiting and write `holder` (who we are) into the file;
        False while another process holds it. `HostDirError` when the file cannot be
        opened or locked at all (the directory is missing or not writable)."""
        if self._fd is not None:
            return True
        for _ in range(3):
            fd = self._open()
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return False
                if not self._still_at_path(fd):
                    # removed or replaced between our open and our lock: what we hold
                    # guards nothing, the file now at the path is the lock
                    os.close(fd)
                    continue
                os.ftruncate(fd, 0)
                os.pwrite(fd, (holder.strip() + "\n").encode("utf-8", "replace"), 0)
            except OSError as exc:
                os.close(fd)
                raise HostDirError(f"node lock {self.path}: {os_error_text(exc)}") from None
            self._fd = fd
            return True
        return False

    def _open(self) -> int:
        try:
            fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                0o644,
            )  # fmt: skip
        except OSError as exc:
            raise HostDirError(
                f"node lock {self.path}: cannot open it as uid {os.geteuid()}: {os_error_text(exc)}"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise HostDirError(f"node lock {self.path}: it is not a regular file")
        return fd

    def _still_at_path(self, fd: int) -> bool:
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (one line, printable characters
        only); "" when nothing readable is there."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            data = os.read(fd, MAX_HOLDER_BYTES)
        except OSError:
            return ""
        finally:
            os.close(fd)
        line = data.decode("utf-8", "replace").splitlines()[0] if data.strip() else ""
        return "".join(c for c in line if c.isprintable()).strip()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
