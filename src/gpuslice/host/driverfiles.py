"""The driver's files on the host, for the node's base CDI spec (`core.cdi.driver`).

The agent sees the host's driver root where the chart mounts it (`containerDriverRoot`,
`/driver-root`); the toolkit's names and directories (which files are the driver's) are the
core's, this adapter only looks: each library directory's files ending in the driver's
version and the host's symlinks to them, the first of each program on the toolkit's
search path, the GSP firmware of that version, the daemons' sockets, and the control device
nodes under the dev root. Paths come back relative to the driver root, as the container
sees them.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.core.cdi.driver import (
    BINARIES,
    BINARY_DIRS,
    CONTROL_NODES,
    FIRMWARE_FILES,
    LIBRARY_DIRS,
    SOCKETS,
    DriverFiles,
    firmware_dir,
    is_driver_library,
)


def _libraries(root: Path, version: str) -> tuple[list[str], list[tuple[str, str]]]:
    libraries: list[str] = []
    links: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for rel in (d for base in LIBRARY_DIRS for d in (base, f"{base}/vdpau")):
        directory = root / rel
        try:
            real = directory.resolve()
            if real in seen or not directory.is_dir():
                continue  # usr/lib64 -> lib64 and the like: mounted once
            seen.add(real)
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        found = {
            e.name for e in entries if is_driver_library(e.name, version) and not e.is_symlink()
        }
        libraries += [f"{rel}/{name}" for name in sorted(found)]
        for entry in entries:
            if not entry.is_symlink() or entry.name in found:
                continue
            try:
                target = os.readlink(entry.path)
                final = Path(entry.path).resolve()
            except OSError:
                continue
            if "/" not in target and final.parent == real and final.name in found:
                links.append((target, f"{rel}/{entry.name}"))
    return libraries, links


def _first(root: Path, dirs: tuple[str, ...], name: str) -> str | None:
    for rel in dirs:
        if os.access(root / rel / name, os.X_OK) and (root / rel / name).is_file():
            return f"{rel}/{name}"
    return None


def find_driver_files(container_driver_root: str, version: str, dev_root: str) -> DriverFiles:
    """What of the driver `version` is under `container_driver_root` (the host's driver
    root as the agent sees it); `dev_root` where the agent sees the device nodes' `dev/`
    (`host.devroot.container_dev_root`)."""
    root = Path(container_driver_root)
    libraries, links = _libraries(root, version)
    binaries = [b for b in (_first(root, BINARY_DIRS, n) for n in BINARIES) if b is not None]
    firmware_rel = firmware_dir(version)
    try:
        firmware = sorted(
            f"{firmware_rel}/{p.name}" for p in (root / firmware_rel).glob(FIRMWARE_FILES)
        )
    except OSError:
        firmware = []
    sockets: list[str] = []
    for rel in SOCKETS:
        daemon = rel.split("/")[-2]
        if not any(s.split("/")[-2] == daemon for s in sockets) and (root / rel).exists():
            sockets.append(rel)
    nodes = tuple(n for n in CONTROL_NODES if (Path(dev_root) / "dev" / n).exists())
    return DriverFiles(
        version,
        tuple(libraries),
        tuple(links),
        tuple(binaries),
        tuple(firmware),
        tuple(sockets),
        nodes,
    )
