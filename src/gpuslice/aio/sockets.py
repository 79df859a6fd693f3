"""Telling socket files apart: the kubelet and others delete and recreate them under us."""

from __future__ import annotations

import os
from pathlib import Path

SocketId = tuple[int, int, int]
"""(device, inode, ctime in ns): a recreated file differs from the one seen before."""


def socket_identity(path: Path) -> SocketId | None:
    """The file's identity, or None if it does not exist (a stat: it does not block)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)
