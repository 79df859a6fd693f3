"""The DRA driver's checkpoint file and the node's boot ID.

The kubelet only resends a claim's namespace, UID and name at Unprepare (the claim may be
gone from the API by then), so what was prepared must be on disk: the file is replaced
atomically on every change, so a crash leaves the old or the new state, never half of one.

Whatever is at the path when the agent starts, reading it ends in bytes or in
`CheckpointUnreadable`, never in a hang or a crash: it is opened non-blocking and without
following a symlink (a FIFO, a symlink loop, a directory, a device are refused on the open
descriptor), and at most `MAX_CHECKPOINT_BYTES` are read (a 100 MB file costs one fstat).
A file that cannot be used is moved aside, renamed with the time and never overwritten or
deleted, for a post-mortem, rather than crashing the agent in a loop, which is what
NVIDIA's driver does (kubernetes-sigs/dra-driver-nvidia-gpu#1100). The boot ID tells a
reboot apart from a restart: after a reboot nothing that was prepared exists any more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from gpuslice.core.errors import GpusliceError
from gpuslice.host.atomic import atomic_write
from gpuslice.textfile import UnreadableFile, read_bytes

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CHECKPOINT_NAME = "gpuslice-checkpoint.json"
"""Not NVIDIA's `checkpoint.json`: with NVIDIA's driver name the plugin directory is the one
NVIDIA's driver used, and a node moving from it to gpuslice must not have its file read as
a corrupt one of ours (or ours read by it, after a move back)."""

OLD_CHECKPOINT_NAME = "checkpoint.json"
"""Where builds before the rename kept the record. Read only while the current name holds
nothing, and used only when it decodes as our format (`core.dra.prepared`): NVIDIA's file
of the same name is never read as ours, moved or changed. Never written, never deleted: a
rollback to such a build finds its own record where it left it."""


def boot_id(path: Path = BOOT_ID) -> str:
    """The kernel's boot ID; empty when unreadable (then no reboot is ever detected)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def boot_time() -> float:
    """When the node booted, in wall-clock seconds: a file older than this was written
    before the reboot, so a pid in it names no process of ours (pids are reused)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024
"""A record of 1,000 claims is well under 1 MiB; what is larger is not one of ours."""


class CheckpointUnreadable(GpusliceError):
    """Something is at the checkpoint's path that cannot be read as a file of ours."""


class CheckpointFile:
    def __init__(self, path: Path, limit: int = MAX_CHECKPOINT_BYTES) -> None:
        self.path = path
        self.limit = limit

    def read(self) -> bytes | None:
        """The file's bytes; None when there is none yet; `CheckpointUnreadable` when what
        is there is not a regular file of at most `limit` bytes, or cannot be read."""
        try:
            return read_bytes(self.path, self.limit, follow_symlinks=False)
        except UnreadableFile as exc:
            if exc.missing:
                return None
            raise CheckpointUnreadable(str(exc)) from None

    def write(self, data: bytes) -> None:
        atomic_write(self.path, data, mode=0o600)

    def quarantine(self) -> Path | None:
        """Move whatever is at the path (a file, a directory, a FIFO, a symlink) aside as
        `<name>.corrupt-<unix time>` (`-2`, `-3`... when that name is taken: nothing kept
        is ever overwritten); its new path, None when nothing was there. OSError when it
        cannot be moved."""
        for target in self._aside_names():
            try:
                self.path.rename(target)
            except FileNotFoundError:
                return None
            return target
        raise OSError(f"no free name to move {self.path} aside")

    def replace_keeping(self, data: bytes) -> Path | None:
        """Write `data` over what is at the path, keeping that aside as `quarantine` does,
        with the path never empty in between: what is there is first linked under the kept
        name, then replaced atomically. An agent killed at any point leaves the old record
        or the new one, never none (no record reads as "nothing created", and what it
        recorded would be lost). Only what cannot be linked (a directory) is moved aside
        first. The kept path, None when nothing was there."""
        for target in self._aside_names():
            try:
                os.link(self.path, target, follow_symlinks=False)
            except FileNotFoundError:
                if os.path.lexists(target):
                    continue  # taken meanwhile
                self.write(data)
                return None
            except FileExistsError:
                continue
            except (IsADirectoryError, PermissionError):  # link(2) says EPERM for a directory
                if self.path.is_symlink() or not self.path.is_dir():
                    raise
                kept = self.quarantine()
                self.write(data)
                return kept
            self.write(data)
            return target
        raise OSError(f"no free name to keep {self.path} aside")

    def _aside_names(self) -> Iterator[Path]:
        stamp = f"{self.path.name}.corrupt-{int(time.time())}"
        for n in range(1, 1000):
            target = self.path.with_name(stamp if n == 1 else f"{stamp}-{n}")
            if not os.path.lexists(target):
                yield target
