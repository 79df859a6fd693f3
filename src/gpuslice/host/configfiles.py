"""Reading config files from disk in every shape users keep them in.

Users have their configs as a single `version: v1` file, as a directory of named files (the
ConfigMap mounted as a volume, with kubelet's `..data` symlink internals), as a ConfigMap
manifest (`kind: ConfigMap`, `data:`) or as Helm values (`config.default` + `config.map`).
All of them end up as `NamedConfigs`: name -> raw text, plus the default name if the source
says one. Parsing and validating the text is the core's job; this module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuslice.core.errors import ConfigError, FieldProblem

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


def _fingerprint(paths: list[Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


def read_config_dir(path: Path) -> NamedConfigs:
    """A ConfigMap volume: every regular file is a named config; `..`-prefixed names are
    the kubelet's atomic-update internals and are skipped (as NVIDIA's config-manager does)."""
    files = sorted(p for p in path.iterdir() if not p.name.startswith("..") and p.is_file())
    texts = {p.name: p.read_text(encoding="utf-8") for p in files}
    return NamedConfigs(texts=texts, source=str(path), fingerprint=_fingerprint(files))


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


def _the_configmap_of(path: Path, text: str) -> object:
    """A multi-document manifest (`kubectl apply -f` files often hold a Namespace and the
    ConfigMap): the one document holding named configs. Several, or none: refused by name,
    not as a YAML syntax error."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        return None  # a real syntax error: the core's parser reports it with its position
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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([FieldProblem("", f"cannot read {path}: {exc.strerror}")]) from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.composer.ComposerError:
        doc = _the_configmap_of(path, text)
    except yaml.YAMLError:
        doc = None  # let the core's parser report the syntax error with its position
    named = _as_named(doc)
    fp = _fingerprint([path])
    if named is not None:
        texts, default = named
        return NamedConfigs(texts=texts, default=default, source=str(path), fingerprint=fp)
    return NamedConfigs(texts={SINGLE: text}, source=str(path), single_file=True, fingerprint=fp)


def fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What `read_configs(path).fingerprint` would be, from `stat` alone: the reload loop
    asks every second, and reading every config's text for that would be wasted work."""
    if path.is_dir():
        return _fingerprint(
            sorted(p for p in path.iterdir() if not p.name.startswith("..") and p.is_file())
        )
    return _fingerprint([path])


def read_configs(path: Path) -> NamedConfigs:
    if path.is_dir():
        return read_config_dir(path)
    return read_config_file(path)
