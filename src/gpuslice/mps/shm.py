"""A size-limited tmpfs on an MPS daemon's shm directory, as NVIDIA's DRA driver mounts one.

The shm directory is the `/dev/shm` of the daemon's clients, mounted read-write into every
MPS pod. As a plain directory under the plugin directory (or `/run/nvidia/mps`) a tenant
writes there without limit and outside the kubelet's disk accounting, and fills the node's
disk. On a tmpfs the pages are memory, charged to the memory cgroup of the pod that writes
them (its own limit holds it), and the mount's `size` bounds them all together. NVIDIA's
driver mounts `tmpfs` with `rw,nosuid,nodev,noexec,relatime,size=<half of MemTotal>` when
a daemon starts and unmounts it when the daemon is stopped; so does this.

What it takes: mount(2) needs CAP_SYS_ADMIN (the chart's privileged container, with MPS
on), and the mount must reach the container runtime that bind-mounts the directory into
the pods: in a container, the directory's host mount must propagate back to the host
(`mountPropagation: Bidirectional`, which Kubernetes allows only privileged containers).
A mount made where it cannot propagate would split the daemon's view of `/dev/shm` from
its clients', so it is not made: `mount` says why instead, and the caller logs it and keeps
the plain directory.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_RELATIME = 0x200000
MNT_DETACH = 0x2
FALLBACK_SIZE = 64 * 1024 * 1024
"""NVIDIA's size when the node's memory cannot be read (65536k)."""


def default_size(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Half the node's memory, in bytes, as NVIDIA sizes it."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_SIZE


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mounts(mountinfo: Path) -> list[tuple[str, str, bool]]:
    """(mount point, filesystem type, shared) for each mount of this process's namespace."""
    out = []
    for line in mountinfo.read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if len(fields) < 6 or not tail:
            continue
        shared = any(f.startswith("shared:") for f in fields[6:])
        out.append((_unescape(fields[4]), tail.split()[0], shared))
    return out


def _tmpfs_on(path: str, mounts: list[tuple[str, str, bool]]) -> bool:
    """Whether a tmpfs is mounted on `path` (a real path) among `mounts`."""
    return any(p == path and kind == "tmpfs" for p, kind, _ in mounts)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class ShmMounts:
    """Mounts and unmounts the tmpfs of shm directories (blocking calls: run them off the
    loop)."""

    def __init__(
        self,
        size_bytes: int | None = None,
        *,
        mountinfo: Path = Path("/proc/self/mountinfo"),
        host_namespace: bool | None = None,
    ) -> None:
        """`host_namespace`: whether this process shares the host's mount namespace (then a
        mount reaches the runtime without propagation); None: told from /proc."""
        self.size_bytes = default_size() if size_bytes is None else size_bytes
        self._mountinfo = mountinfo
        self._host_namespace = host_namespace

    def mount_point(self, directory: str) -> bool:
        """Whether a tmpfs is mounted on `directory`."""
        path = os.path.realpath(directory)
        try:
            return _tmpfs_on(path, _mounts(self._mountinfo))
        except OSError:
            return False

    def mount(self, directory: str) -> str | None:
        """A tmpfs on `directory` (an existing one is kept); None when it is there, else
        why it is not (nothing was changed)."""
        path = os.path.realpath(directory)
        try:
            mounts = _mounts(self._mountinfo)
        except OSError as exc:
            return f"reading {self._mountinfo}: {exc}"
        if _tmpfs_on(path, mounts):
            return None
        why = self._unreachable(path, mounts)
        if why is not None:
            return why
        options = f"size={self.size_bytes}".encode()
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME
        if _libc().mount(b"shm", path.encode(), b"tmpfs", flags, options) != 0:
            code = ctypes.get_errno()
            hint = (
                " (mounting needs CAP_SYS_ADMIN: the chart's privileged container, mps.enabled)"
                if code == errno.EPERM
                else ""
            )
            return f"mount tmpfs: [Errno {code}] {os.strerror(code)}{hint}"
        return None

    def _unreachable(self, path: str, mounts: list[tuple[str, str, bool]]) -> str | None:
        """Why a mount at `path` would not reach the pods, or None."""
        holder = max(
            (m for m in mounts if path == m[0] or path.startswith(m[0].rstrip("/") + "/")),
            key=lambda m: len(m[0]),
            default=None,
        )
        if holder is not None and holder[2]:
            return None  # a shared mount: propagates to its peers (the host's)
        if self._in_host_namespace():
            return None
        where = holder[0] if holder is not None else "/"
        return (
            f"the mount holding it ({where}) does not propagate to the host, so the pods "
            "would not see the tmpfs (in a container: mountPropagation Bidirectional, "
            "which the chart sets with mps.enabled)"
        )

    def _in_host_namespace(self) -> bool:
        if self._host_namespace is not None:
            return self._host_namespace
        if os.getpid() == 1:
            return False  # a container's first process (the chart runs the agent so)
        try:
            return os.stat("/proc/self/ns/mnt").st_ino == os.stat("/proc/1/ns/mnt").st_ino
        except OSError:
            return False


def unmount(directory: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """Unmount the tmpfs on `directory` if there is one (lazily: a client still holding a
    file does not keep the mount); None when none is left, else why."""
    path = os.path.realpath(directory)
    try:
        mounted = _tmpfs_on(path, _mounts(mountinfo))
    except OSError as exc:
        return f"reading {mountinfo}: {exc}"
    if not mounted:
        return None
    if _libc().umount2(path.encode(), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        return f"umount: [Errno {code}] {os.strerror(code)}"
    return None
