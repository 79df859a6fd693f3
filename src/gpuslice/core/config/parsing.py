"""From config text (YAML or JSON) to a validated `Config`, or a `ConfigError` listing
every problem.

No file I/O here: callers read files and pass the text, with the file name as `source` so
messages say which file is wrong. Nothing but `ConfigError` leaves this module: a YAML
syntax error or a pydantic error reaching a user as a traceback is a bug.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from gpuslice.core.config.fields import show
from gpuslice.core.config.problems import problems_from
from gpuslice.core.config.schema import Config
from gpuslice.core.errors import ConfigError, FieldProblem


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, column: int) -> None:
        self.key, self.line, self.column = key, line, column


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML keeps the last one silently, which
    hides the first `replicas:` a user wrote."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable key: construct_mapping reports it with its position
        if duplicate:
            mark = key_node.start_mark
            raise _DuplicateKey(key, mark.line + 1, mark.column + 1)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key, 0, 0)
        out[key] = value
    return out


def _load(text: str, source: str) -> object:
    try:
        if text.lstrip().startswith("{"):
            try:
                return json.loads(text, object_pairs_hook=_json_pairs)
            except json.JSONDecodeError:
                pass  # YAML flow style also starts with "{"; let the YAML parser judge it
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKey as dup:
        where = f" at line {dup.line}, column {dup.column}" if dup.line else ""
        message = f"duplicate key {show(dup.key)}{where}; each key may appear once"
        raise ConfigError([FieldProblem("", message)], source=source) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = "; ".join(p for p in (exc.context, exc.problem) if p)
        message = f"YAML syntax error{where}: {detail}"
        raise ConfigError([FieldProblem("", message)], source=source) from None
    except yaml.YAMLError as exc:
        raise ConfigError([FieldProblem("", f"YAML syntax error: {exc}")], source=source) from None
    except RecursionError:
        raise ConfigError([FieldProblem("", _TOO_DEEP)], source=source) from None


_TOO_DEEP = "the document is nested too deeply to be a config"


_EMPTY_WHEN_NULL = frozenset({("sharing", "timeSlicing"), ("sharing", "mps")})
"""`timeSlicing:` with nothing under it is a block the user wrote, not an unset key: NVIDIA
unmarshals it into an empty block and refuses it ("no resources specified",
`api/config/v1/replicas.go`), rather than loading a config that silently shares nothing."""


def _without_nulls(value: object, path: tuple[str, ...] = ()) -> object:
    """A key set to null means "unset" (NVIDIA's own dump writes `useNodeFeatureAPI: null`),
    so it takes the default instead of failing a type check."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            key = (*path, str(k))
            if v is None and key in _EMPTY_WHEN_NULL:
                out[str(k)] = {}
            elif v is not None:
                out[str(k)] = _without_nulls(v, key)
        return out
    if isinstance(value, list):
        return [_without_nulls(v, path) for v in value]
    return value


def validate_document(doc: object, source: str = "<config>") -> Config:
    """Validate an already-loaded document (a mapping as YAML gives it)."""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(
            [
                FieldProblem(
                    "",
                    "a config must be a mapping with the keys version, flags, resources, "
                    f"sharing and imex; got {show(doc)}",
                )
            ],
            source=source,
        )
    try:
        return Config.model_validate(_without_nulls(dict(doc)))
    except RecursionError:
        raise ConfigError([FieldProblem("", _TOO_DEEP)], source=source) from None
    except ValidationError as exc:
        raise ConfigError(problems_from(Config, exc), source=source) from None


def parse_config(text: str, source: str = "<config>") -> Config:
    """Parse and validate a `version: v1` config. An empty text is the all-defaults config
    (the Helm `config.map` entry `default: |-` with nothing after it)."""
    return validate_document(_load(text, source), source)
