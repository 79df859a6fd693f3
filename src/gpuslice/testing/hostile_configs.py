"""Hostile things to put at a config path, each with what it does to the path.

Shared by the fault suite (`tests/faults`) and `bench/bench_faults.py`. Each entry replaces
whatever is at the path (a file, a directory, a FIFO, a symlink) in one rename where it can,
as an editor or a ConfigMap update would.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Nine levels of nine aliases: under 1 KB of text, hundreds of millions of values."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    """Build the new thing beside `path`, then swap it in."""
    tmp = path.with_name(path.name + ".new")
    _remove(tmp)
    make(tmp)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif tmp.is_dir() and not tmp.is_symlink() and (path.exists() or path.is_symlink()):
        path.unlink()
    os.replace(tmp, path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def text(content: str | bytes) -> Callable[[Path], None]:
    data = content.encode("utf-8") if isinstance(content, str) else content

    def write(p: Path) -> None:
        p.write_bytes(data)

    def put(path: Path) -> None:
        _replace(path, write)

    return put


def big_file(size: int) -> Callable[[Path], None]:
    def put(path: Path) -> None:
        line = b"# " + b"x" * 77 + b"\n"

        def make(p: Path) -> None:
            with p.open("wb") as f:
                for _ in range(size // len(line) + 1):
                    f.write(line)

        _replace(path, make)

    return put


def fifo(path: Path) -> None:
    _replace(path, lambda p: os.mkfifo(p))


def symlink_to(target: str) -> Callable[[Path], None]:
    def put(path: Path) -> None:
        _replace(path, lambda p: p.symlink_to(target))

    return put


def symlink_loop(path: Path) -> None:
    def make(p: Path) -> None:
        p.symlink_to(p.name + ".loop")
        loop = p.with_name(p.name + ".loop")
        _remove(loop)
        loop.symlink_to(path.name)

    _replace(path, make)


def empty_dir(path: Path) -> None:
    _replace(path, lambda p: p.mkdir())


def missing(path: Path) -> None:
    _remove(path)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "utf-16": text("version: v1\nflags:\n  migStrategy: none\n".encode("utf-16")),
    "invalid-utf-8": text(b"version: v1\nflags: {migStrategy: \xff\xfe}\n"),
    "huge-integer": text("version: v1\nflags:\n  x: " + "9" * 5000 + "\n"),
    "huge-integer-json": text('{"version": "v1", "x": ' + "9" * 5000 + "}"),
    "bad-date": text("version: v1\nflags:\n  when: 2001-02-30\n"),
    "deep-yaml": text("version: v1\nx: " + "[" * 600 + "]" * 600 + "\n"),
    "deep-json": text('{"version": "v1", "x": ' + "[" * 600 + "]" * 600 + "}"),
    "deep-block": text("".join("  " * i + f"k{i}:\n" for i in range(600))),
    "alias-bomb": text(alias_bomb()),
    "binary-garbage": text(bytes(range(256)) * 8),
    "50-MB-file": big_file(50 * 1024 * 1024),
    "fifo": fifo,
    "symlink-to-dev-zero": symlink_to("/dev/zero"),
    "unreadable-proc-file": symlink_to("/proc/self/mem"),
    "symlink-loop": symlink_loop,
    "dangling-symlink": symlink_to("/nonexistent/gpuslice-config.yaml"),
    "empty-directory": empty_dir,
    "missing": missing,
}
"""Name -> how to put it at the config path. `unreadable-proc-file` is readable as root by
permission bits but fails with EIO on read, which is what an unreadable file must do when
the tests run as root."""
