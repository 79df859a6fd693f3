"""Reading config files from disk in every shape users keep them in.

Users have their configs as a single `version: v1` file, as a directory of named files (the
ConfigMap mounted as a volume, with kubelet's `..data` symlink internals), as a ConfigMap
manifest (`kind: ConfigMap`, `data:`) or as Helm values (`config.default` + `config.map`).
All of them end up as `NamedConfigs`: name -> raw text, plus the default name if the source
says one. Parsing and validating the text is the core's job; this module only reads.

Reading cannot hurt the daemon: every file goes through `textfile.read_text` (regular
files only, opened non-blocking, at most MAX_BYTES, a ConfigMap's own cap, UTF-8 only).
Every failure, a missing, dangling or looping path included, is a ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.config.parsing import load_documents
from gpuslice.core.errors import ConfigError, FieldProblem
from gpuslice.textfile import UnreadableFile, read_text

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


def read_bounded(path: Path, limit: int = MAX_BYTES) -> tuple[str, tuple[str, int, int]]:
    """`textfile.read_text` with its refusals as the ConfigError the reload loop reports."""
    try:
        return read_text(path, limit)
    except UnreadableFile as exc:
        raise _refuse(path, exc.reason) from None


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
