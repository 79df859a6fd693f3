"""Reading `/proc/<pid>/cgroup` for GPU PIDs, under an injectable proc root.

The root is a parameter so tests build a fake `/proc` tree from plain directories and the
exporter, running with `hostPID: true`, reads the host's. A process can exit between NVML
listing it and this read; that and an unreadable file simply leave the PID out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpuslice.core.cgroups import CgroupIdentity, parse_cgroup

DEFAULT_PROC_ROOT = Path("/proc")


def read_cgroup_text(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> str | None:
    try:
        return (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cgroup_identities(
    pids: Iterable[int], proc_root: Path = DEFAULT_PROC_ROOT
) -> dict[int, CgroupIdentity]:
    """PID -> pod identity for the PIDs that run in a pod; others are absent."""
    out: dict[int, CgroupIdentity] = {}
    for pid in set(pids):
        text = read_cgroup_text(pid, proc_root)
        if text is None:
            continue
        identity = parse_cgroup(text)
        if identity is not None:
            out[pid] = identity
    return out
