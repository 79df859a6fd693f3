"""Reading a small file (a config, a claims file, a checkpoint, an MPS pid file) without
letting the file decide how long the read takes or how much memory it uses.

A path is opened non-blocking and read only if `fstat` on the open descriptor says it is a
regular file: a FIFO would block the open or the read forever, `/dev/zero` (or a symlink to
it) never ends, a directory cannot be read. The size is checked before the first byte is
read, and no more than the limit is ever read, so a 300 MB file costs one `fstat`. Bytes
that are not UTF-8 are refused, naming UTF-16 when it looks like it. Every failure (missing,
dangling, looping, unreadable) is an `UnreadableFile` that says why in words.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from gpuslice.core.errors import GpusliceError


class UnreadableFile(GpusliceError):
    """A file refused before or while it was read. `reason` reads after the path:
    `<path>: it is a FIFO, not a regular file`."""

    def __init__(
        self, path: Path, reason: str, *, missing: bool = False, size: int | None = None
    ) -> None:
        self.path = path
        self.reason = reason
        self.missing = missing
        """Nothing at the path at all (the only failure a first start expects)."""
        self.size = size
        """Its size, when it was refused for being over the limit (a caller's own words)."""
        super().__init__(f"{path}: {reason}")


Fingerprint = tuple[str, int, int]
"""(path, mtime_ns, size) of what was read; size -1 when the file changed during the read."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: Path, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, under the same rules as
    `read_text`. `follow_symlinks=False` refuses a symlink at `path` itself (a file only the
    agent writes is never one). A missing file is an `UnreadableFile` whose `missing` is
    true."""
    data, _, _ = _read(path, limit, follow_symlinks)
    return data


def read_text(path: Path, limit: int) -> tuple[str, Fingerprint]:
    """The UTF-8 text of a regular file of at most `limit` bytes, with its fingerprint
    taken from the open file. Never blocks: the open is non-blocking and the file type is
    checked on the descriptor (no race with a swap between a check and the open)."""
    data, st, after = _read(path, limit, True)
    total = len(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise UnreadableFile(
            path, f"it is not UTF-8{hint}: invalid byte at offset {exc.start}"
        ) from None
    # the fingerprint of what was read: a file written to while it was read gets one that
    # matches no stat of it (size -1), so a reload loop does not take it as settled
    size = after.st_size if (after.st_mtime_ns, after.st_size) == (st.st_mtime_ns, total) else -1
    return text, (str(path), after.st_mtime_ns, size)


def _read(
    path: Path, limit: int, follow_symlinks: bool
) -> tuple[bytes, os.stat_result, os.stat_result]:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise UnreadableFile(path, f"cannot read it: {exc.strerror}", missing=True) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UnreadableFile(path, "it is a symlink, not a regular file") from None
        raise UnreadableFile(path, f"cannot read it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(path, f"it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UnreadableFile(
                path, f"it is {st.st_size} bytes; at most {limit} are read", size=st.st_size
            )
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # grew after the fstat
            raise UnreadableFile(
                path, f"it is more than {limit} bytes; at most {limit} are read", size=total
            )
        after = os.fstat(fd)
    except OSError as exc:
        raise UnreadableFile(path, f"cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks), st, after
