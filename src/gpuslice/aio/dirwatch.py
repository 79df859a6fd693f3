"""Being woken when an entry of the device-plugin directory is created, deleted or moved.

The socket watch is level-triggered: it compares the kubelet's and the plugins' sockets
with what it last saw. Polling that every 150 ms was the daemon's largest idle cost, so the
watch sleeps until inotify says the directory changed, with a slow tick as a safety net.
A directory deleted or moved away ends its watch (`armed` turns False, so the caller
re-arms on what is there now and polls fast until it exists); a queue overflow is a change
like any other. Linux inotify through
`ctypes` (the syscalls are three and stable); where it is unavailable, `DirWatch.open`
returns None and the caller keeps its fast tick.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_MASK = (
    _IN_ATTRIB
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_CONTENTS_MASK = _MASK | _IN_MODIFY | _IN_CLOSE_WRITE


_EVENT = struct.Struct("iIII")
"""`struct inotify_event` before its name: wd, mask, cookie, len."""
_IN_IGNORED = 0x8000


def _ended_watches(data: bytes) -> set[int]:
    """Watches whose directory was deleted or moved, from the events read (a watch on a
    moved directory would follow it elsewhere, so it counts as ended)."""
    ended: set[int] = set()
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
            ended.add(wd)
        offset += _EVENT.size + length
    return ended


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


class DirWatch:
    """One inotify watch on a directory; `changed` is set when anything in it changes."""

    def __init__(self, fd: int, libc: ctypes.CDLL, directory: Path, mask: int = _MASK) -> None:
        self._fd = fd
        self._libc = libc
        self._dir = directory
        self._mask = mask
        self._wd = -1
        self._ended = -1
        self.changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(fd, self._drain)
        self.rearm()

    @classmethod
    def open(cls, directory: Path, *, contents: bool = False) -> DirWatch | None:
        """A watch on `directory`, or None where inotify cannot be used. With `contents`,
        a write to a file in it counts as a change too (config files edited in place)."""
        libc = _libc()
        if libc is None or not hasattr(libc, "inotify_init1"):
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        return cls(fd, libc, directory, _CONTENTS_MASK if contents else _MASK)

    def rearm(self) -> None:
        """(Re)add the watch: after the directory was replaced, or once it exists."""
        if self._ended >= 0:  # a moved directory's watch would still report from there
            self._libc.inotify_rm_watch(self._fd, self._ended)
            self._ended = -1
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(self._dir), self._mask)
        self._wd = wd  # -1 while the directory is missing: the slow tick retries

    @property
    def armed(self) -> bool:
        return self._wd >= 0

    def _drain(self) -> None:
        try:
            while data := os.read(self._fd, 65536):
                if self._wd in _ended_watches(data):
                    # the directory went: `rearm` drops this watch, watches what is there now
                    self._ended = self._wd
                    self._wd = -1
        except BlockingIOError:
            pass
        except OSError:
            self._wd = -1
        self.changed.set()

    def close(self) -> None:
        if self._fd >= 0:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
