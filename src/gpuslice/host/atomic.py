"""Replacing a file so that no reader ever sees it half-written.

The label file (read by NFD), CDI specs (read by the container runtime whenever a container
starts) and the DRA checkpoint (read by the next agent after a crash) all have readers that
may look at any moment. The content goes to a temporary file in the same directory, is
synced, and is renamed over the old name: atomic on POSIX within one filesystem.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import suppress
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
