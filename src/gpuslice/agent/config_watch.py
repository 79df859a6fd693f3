"""Being woken when the config the agent reads could have changed.

The reload loop used to `stat` the config path every second, three wake-ups a second on a
node whose config changes a few times a year. Now inotify watches the directories that hold
it (a ConfigMap volume swaps its `..data` symlink in the mount directory; a file edited in
place is a write in its directory; a symlinked path is watched where it points too), and
the loop sleeps until one of them changes, with a slow rescan as the safety net for what
inotify cannot see (network filesystems, a directory replaced further up the path).
Where a directory is missing or inotify is unavailable, `armed` is False and the loop keeps
its one-second poll, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from gpuslice.aio.dirwatch import DirWatch
from gpuslice.aio.races import first_of


def watched_directories(path: Path) -> list[Path]:
    """The directories whose entries decide what `path` reads: the path itself when it is
    a directory of named configs, else the directory holding it; and the same for where it
    resolves to, when that differs (a symlink into a ConfigMap's `..data`)."""
    out: list[Path] = []
    candidates = [path]
    with contextlib.suppress(OSError, RuntimeError):  # a loop: its own directory is watched
        candidates.append(path.resolve())
    for p in candidates:
        try:
            is_dir = p.is_dir()
        except OSError:  # unreadable: its directory is watched, the rescan reports it
            is_dir = False
        directory = p if is_dir else p.parent
        if directory not in out:
            out.append(directory)
    return out


class ConfigWatch:
    """inotify watches on `watched_directories(path)`; `wait` returns when one changed."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._watches: dict[Path, DirWatch | None] = {}
        self.rearm()

    @property
    def armed(self) -> bool:
        """Every directory is watched (else the caller polls)."""
        watches = self._watches.values()
        return bool(watches) and all(w is not None and w.armed for w in watches)

    def rearm(self) -> None:
        """Watch the directories the path depends on now: after a change a symlink may
        point elsewhere, or a directory that was missing may exist."""
        wanted = watched_directories(self._path)
        for directory in [d for d in self._watches if d not in wanted]:
            gone = self._watches.pop(directory)
            if gone is not None:
                gone.close()
        for directory in wanted:
            watch = self._watches.get(directory)
            if watch is None:
                self._watches[directory] = DirWatch.open(directory, contents=True)
            else:
                watch.rearm()

    async def wait(self) -> None:
        """Until some watched directory changed since the last `clear`."""
        events = [w.changed for w in self._watches.values() if w is not None]
        if not events:
            await asyncio.Event().wait()  # nothing watched: only the caller's timeout ends it
        if any(e.is_set() for e in events):
            return
        await first_of(*(e.wait() for e in events))

    def clear(self) -> None:
        for watch in self._watches.values():
            if watch is not None:
                watch.changed.clear()

    def close(self) -> None:
        for watch in self._watches.values():
            if watch is not None:
                watch.close()
        self._watches = {}
