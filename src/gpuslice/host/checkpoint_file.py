"""The DRA driver's checkpoint file and the node's boot ID.

The kubelet only resends a claim's namespace, UID and name at Unprepare (the claim may be
gone from the API by then), so what was prepared must be on disk: the file is replaced
atomically on every change, so a crash leaves the old or the new state, never half of one.
A file that cannot be decoded is moved aside (kept for a post-mortem) rather than crashing
the agent in a loop, which is what NVIDIA's driver does (its #1100). The boot ID tells a
reboot apart from a restart: after a reboot nothing that was prepared exists any more.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuslice.host.atomic import atomic_write

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CHECKPOINT_NAME = "gpuslice-checkpoint.json"
"""Not NVIDIA's `checkpoint.json`: with NVIDIA's driver name the plugin directory is the one
NVIDIA's driver used, and a node moving from it to gpuslice must not have its file read as
a corrupt one of ours (or ours read by it, after a move back)."""


def boot_id(path: Path = BOOT_ID) -> str:
    """The kernel's boot ID; empty when unreadable (then no reboot is ever detected)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


class CheckpointFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> bytes | None:
        """The file's bytes; None when there is none yet."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        atomic_write(self.path, data, mode=0o600)

    def quarantine(self) -> Path | None:
        """Move an undecodable file aside as `<name>.corrupt-<unix time>`; its new path."""
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            self.path.rename(target)
        except FileNotFoundError:
            return None
        return target
