"""A driver root on disk as a driver installation leaves it, for the base CDI spec's tests
(`core.cdi.driver`, `host.driverfiles`): libraries with the version suffix and their
symlinks, a legacy library, a library of another version and one not the driver's, programs,
GSP firmware, the persistence daemon's socket (a plain file stands for it) and the control
device nodes (plain files too: only their presence is looked at)."""

from __future__ import annotations

import os
from pathlib import Path

LIB_DIR = "usr/lib/x86_64-linux-gnu"


def fake_driver_root(root: Path, version: str) -> Path:
    """`root` holding driver `version`'s files (created); returns `root`."""
    lib = root / LIB_DIR
    (lib / "vdpau").mkdir(parents=True)
    for name in (f"libcuda.so.{version}", f"libnvidia-ml.so.{version}",
                 "libnvidia-nvvm70.so.4", "libnvidia-ml.so.470.01", "libfoo.so.1"):  # fmt: skip
        (lib / name).write_bytes(b"\x7fELF")
    (lib / "vdpau" / f"libvdpau_nvidia.so.{version}").write_bytes(b"\x7fELF")
    os.symlink(f"libcuda.so.{version}", lib / "libcuda.so.1")
    os.symlink("libcuda.so.1", lib / "libcuda.so")
    os.symlink(f"libnvidia-ml.so.{version}", lib / "libnvidia-ml.so.1")
    os.symlink("libfoo.so.1", lib / "libfoo.so")
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True)
    for name in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (bin_dir / name).write_text("#!/bin/sh\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True)
    (firmware / "gsp_ga10x.bin").write_bytes(b"")
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    (root / "run/nvidia-persistenced/socket").write_bytes(b"")
    (root / "dev").mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (root / "dev" / name).write_bytes(b"")
    return root


def fake_hook(path: Path) -> Path:
    """An executable standing for the toolkit's `nvidia-cdi-hook` at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    return path
