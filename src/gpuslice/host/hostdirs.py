"""Checking, before anything is written, that the agent may write the host directories it
needs, so that missing rights end the start in one line naming the directory and the
errno, instead of a traceback from whichever task first touched it.

The usual cause is an image run as its own uid against root-owned kubelet directories; a
read-only mount (EROFS) and a path through a regular file (ENOTDIR) read the same way.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from gpuslice.core.errors import GpusliceError


class HostDirError(GpusliceError):
    """A host directory or file the agent needs cannot be used: which, and why (errno)."""


def os_error_text(exc: OSError) -> str:
    """`[Errno 13] Permission denied (EACCES)`: the number, the words and the name that
    operators search for."""
    code = exc.errno
    name = errno.errorcode.get(code, "") if code is not None else ""
    words = exc.strerror or str(exc)
    text = f"[Errno {code}] {words}" if code is not None else words
    return f"{text} ({name})" if name else text


def _who() -> str:
    return f"uid {os.geteuid()} gid {os.getegid()}"


def writable_dir(path: Path, what: str, *, create: bool = True) -> None:
    """`path` is a directory this process can create files in (made first when `create`).

    Writability is tried with an unnamed `O_TMPFILE` file: the kernel's own answer (EACCES,
    EROFS) for this process, which `access(2)` only approximates, and nothing appears in
    the directory for a watcher (the kubelet's plugin watcher) to see. Where the
    filesystem has no `O_TMPFILE`, `access(2)` answers instead."""
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        st = path.stat()
    except OSError as exc:
        verb = "cannot create it" if create else "cannot use it"
        raise HostDirError(f"{what} {path}: {verb} as {_who()}: {os_error_text(exc)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise HostDirError(f"{what} {path}: it is not a directory")
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            fd = os.open(path, tmpfile | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise HostDirError(
                    f"{what} {path}: cannot write in it as {_who()}: {os_error_text(exc)}"
                ) from None
        else:
            os.close(fd)
            return
    if not os.access(path, os.W_OK | os.X_OK):
        denied = OSError(errno.EACCES, os.strerror(errno.EACCES))
        raise HostDirError(
            f"{what} {path}: cannot write in it as {_who()}: {os_error_text(denied)}"
        )


def readable_if_present(path: Path, what: str) -> None:
    """A file the agent must read back (its checkpoint) is readable when it exists: one
    the agent may not open (left by a root agent, now read by the image's uid) is not
    corrupt, and must not be handled as if it were (moved aside, its claims forgotten)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise HostDirError(
                f"{what} {path}: cannot read it as {_who()}: {os_error_text(exc)}"
            ) from None
        return  # missing, or not a file of ours: the checkpoint's own reader says why
    os.close(fd)
