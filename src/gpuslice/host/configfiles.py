"""Reading config files from disk in every shape users keep them in.

Users have their configs as a single `version: v1` file, as a directory of named files (the
ConfigMap mounted as a volume, with kubelet's `..data` symlink internals), as a ConfigMap
manifest (`kind: ConfigMap`, `data:`) or as Helm values (`config.default` + `config.map`).
All of them end up as `NamedConfigs`: name -> raw text, plus the default name if the source
says one. Parsing and validating the text is the core's job; this module only reads.

Reading cannot hurt the daemon: a path is opened non-blocking and read only if `fstat`
says it is a regular file (a FIFO or a symlink to `/dev/zero` would block or never end),
at most MAX_BYTES are read (a ConfigMap's own cap), and bytes that are not UTF-8 are a
rejection. Every failure, a missing, dangling or looping path included, is a ConfigError.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.config.parsing import load_documents
from gpuslice.core.errors import ConfigError, FieldProblem

MAX_BYTES = 1024 * 1024
"""Largest config file (or directory of them, in total) read: 1 MiB, a ConfigMap's limit."""

SINGLE = ""
"""The name given to a lone config file (not a set of named configs)."""


@dataclass(frozen=True, slots=True)
class NamedConfigs:
    texts: dict[str, str]
    default: str = ""
    source: str = ""
    single_file: bool = False
    fingerprint: tuple[tuple[str, int, int], ...] = field(default=())
    """(name, mtime_ns, size) of what was read: cheap change detection for reloads."""


def _refuse(path: Path, message: str) -> ConfigError:
    return ConfigError([FieldProblem("", message)], source=str(path))


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(path: Path, limit: int = MAX_BYTES) -> tuple[str, tuple[str, int, int]]:
    """The UTF-8 text of a regular file of at most `limit` bytes, with its fingerprint
    taken from the open file. Never blocks: the open is non-blocking and the file type is
    checked on the descriptor (no race with a swap between a check and the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise _refuse(path, f"cannot read it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, f"it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise _refuse(path, f"it is {st.st_size} bytes; at most {limit} are read")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # grew after the fstat
            raise _refuse(path, f"it is more than {limit} bytes; at most {limit} are read")
        after = os.fstat(fd)
    except OSError as exc:
        raise _refuse(path, f"cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise _refuse(path, f"it is not UTF-8{hint}: invalid byte at offset {exc.start}") from None
    # the fingerprint of what was read: a file written to while it was read gets one that
    # matches no stat of it (size -1), so the reload loop does not take it as settled
    size = after.st_size if (after.st_mtime_ns, after.st_size) == (st.st_mtime_ns, total) else -1
    return text, (str(path), after.st_mtime_ns, size)


def _fingerprint(paths: list[Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError as exc:
            # a path that cannot be stat'ed still changes the fingerprint, so the reload
            # loop tries it and reports why (missing, dangling, a loop)
            out.append((f"{p} ({exc.strerror})", 0, 0))
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


def _dir_entries(path: Path) -> list[Path]:
    try:
        entries = sorted(path.iterdir())
    except OSError as exc:
        raise _refuse(path, f"cannot list it: {exc.strerror}") from None
    return [p for p in entries if not p.name.startswith("..") and p.is_file()]


def read_config_dir(path: Path) -> NamedConfigs:
    """A ConfigMap volume: every regular file is a named config; `..`-prefixed names are
    the kubelet's atomic-update internals and are skipped (as NVIDIA's config-manager does).
    An empty directory is refused: it is a mount that went wrong, not a config."""
    files = _dir_entries(path)
    if not files:
        raise _refuse(path, "the config directory holds no config files")
    texts: dict[str, str] = {}
    prints = []
    budget = MAX_BYTES
    for p in files:
        text, fp = read_bounded(p, budget)
        budget -= len(text.encode("utf-8"))
        texts[p.name] = text
        prints.append(fp)
    return NamedConfigs(texts=texts, source=str(path), fingerprint=tuple(prints))


def _as_named(doc: object) -> tuple[dict[str, str], str] | None:
    """Recognise a ConfigMap manifest or Helm values holding named configs."""
    if not isinstance(doc, dict):
        return None
    if doc.get("kind") == "ConfigMap" and isinstance(doc.get("data"), dict):
        data = doc["data"]
        return {str(k): "" if v is None else str(v) for k, v in data.items()}, ""
    cfg = doc.get("config")
    if isinstance(cfg, dict) and isinstance(cfg.get("map"), dict):
        entries = {str(k): "" if v is None else str(v) for k, v in cfg["map"].items()}
        default = cfg.get("default") or ""
        return entries, str(default)
    return None


def _the_configmap_of(path: Path, docs: list[object]) -> object:
    """A multi-document manifest (`kubectl apply -f` files often hold a Namespace and the
    ConfigMap): the one document holding named configs. Several, or none: refused by name,
    not as a YAML syntax error."""
    holders = [d for d in docs if _as_named(d) is not None]
    if len(holders) == 1:
        return holders[0]
    kinds = ", ".join(str(d.get("kind", "?")) if isinstance(d, dict) else "?" for d in docs)
    why = "several hold named configs" if holders else "none is a ConfigMap with data"
    raise ConfigError(
        [FieldProblem("", f"{path} holds {len(docs)} YAML documents ({kinds}): {why}")]
    )


def read_config_file(path: Path) -> NamedConfigs:
    """One file: a config, a ConfigMap manifest, or Helm values with `config.map`."""
    text, print_ = read_bounded(path)
    docs = [d for d in load_documents(text, source=str(path)) if d is not None]
    doc = docs[0] if len(docs) == 1 else _the_configmap_of(path, docs) if docs else None
    named = _as_named(doc)
    fp = (print_,)
    if named is not None:
        texts, default = named
        return NamedConfigs(texts=texts, default=default, source=str(path), fingerprint=fp)
    return NamedConfigs(texts={SINGLE: text}, source=str(path), single_file=True, fingerprint=fp)


def fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What `read_configs(path).fingerprint` would be, from `stat` alone: the reload loop
    asks every second, and reading every config's text for that would be wasted work."""
    if path.is_dir():
        try:
            return _fingerprint(_dir_entries(path)) or ((f"{path} (empty)", 0, 0),)
        except ConfigError:
            return ((f"{path} (unlistable)", 0, 0),)
    return _fingerprint([path])


def read_configs(path: Path) -> NamedConfigs:
    if path.is_dir():
        return read_config_dir(path)
    return read_config_file(path)
