"""From config text (YAML or JSON) to a validated `Config`, or a `ConfigError` listing
every problem.

No file I/O here: callers read files and pass the text, with the file name as `source` so
messages say which file is wrong. Nothing but `ConfigError` leaves this module: a YAML
syntax error, a pydantic error, a `RecursionError` or a `ValueError` from a constructor
reaching a user as a traceback (or ending the reload loop) is a bug.

A config reaches every node at once, so the loader is bounded before anything expands: the
nesting depth is checked while the YAML is composed (before the recursive constructor runs),
the size the document would have once its aliases are expanded is counted on the composed
node graph (an alias bomb is a few hundred nodes there, and is refused before construction),
and integers longer than a config could ever need are refused by their digit count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpuslice.core.config.fields import show
from gpuslice.core.config.problems import problems_from
from gpuslice.core.config.schema import Config
from gpuslice.core.errors import ConfigError, FieldProblem
from gpuslice.core.jsontypes import Json


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, column: int) -> None:
        self.key, self.line, self.column = key, line, column


MAX_DEPTH = 64
"""Deepest nesting accepted. A real config is about six levels deep; the bound keeps the
recursive composer, constructor and validator far from Python's recursion limit."""

MAX_NODES = 200_000
"""Most values a document may hold once its aliases are expanded (a 1 MiB file of short
scalars is about this many); an alias bomb expands to hundreds of millions."""

MAX_INT_DIGITS = 40
"""Longest integer accepted: Python refuses to convert more than 4,300 digits with a
ValueError, and no field of a config needs more than a few."""


class _Refused(Exception):
    """A bound the document exceeds, with a message for the user."""

    def __init__(self, message: str, mark: yaml.Mark | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


def _at(mark: yaml.Mark | None) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (YAML keeps the last one silently, which
    hides the first `replicas:` a user wrote) and documents nested deeper than MAX_DEPTH,
    and that gives a constructor's ValueError (a date like 2001-02-30) its position."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _Refused(f"the document is nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {show(node.value)}: {exc}", node.start_mark
            ) from None


class _PlainDatesLoader(_StrictLoader):
    """The strict loader with no implicit timestamps: `2001-02-30` and `2024-05-01` stay
    the strings they are to Kubernetes (its YAML reader hands timestamp-like scalars to
    JSON as strings), so a manifest's annotation cannot fail on, or turn into, a date."""


_PlainDatesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
}


_INT_TAG = "tag:yaml.org,2002:int"


def _check_graph(root: Node) -> int:
    """Refuse a composed document whose expansion (aliases followed) is too deep, too
    large, recursive, or holds an oversized integer; return its expanded size. Memoised per
    node, so an alias bomb costs what its text costs, not what it expands to."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, height)
    active: set[int] = set()

    def walk(node: Node, level: int) -> tuple[int, int]:
        key = id(node)
        if key in active:
            raise _Refused("an alias refers to a node that contains it", node.start_mark)
        known = sizes.get(key)
        if known is None:
            if level > MAX_DEPTH:
                raise _Refused(
                    f"the document is nested more than {MAX_DEPTH} levels deep", node.start_mark
                )
            active.add(key)
            size, height = 1, 1
            if isinstance(node, ScalarNode):
                if node.tag == _INT_TAG and len(node.value) > MAX_INT_DIGITS:
                    raise _Refused(
                        f"an integer of {len(node.value)} characters; "
                        f"at most {MAX_INT_DIGITS} are accepted",
                        node.start_mark,
                    )
            else:
                children: list[Node] = []
                if isinstance(node, SequenceNode):
                    children = list(node.value)
                elif isinstance(node, MappingNode):
                    children = [n for pair in node.value for n in pair]
                for child in children:
                    child_size, child_height = walk(child, level + 1)
                    size += child_size
                    height = max(height, child_height + 1)
                    if size > MAX_NODES:
                        break
            active.discard(key)
            known = sizes[key] = (size, height)
        if level + known[1] - 1 > MAX_DEPTH:
            raise _Refused(
                f"the document is nested more than {MAX_DEPTH} levels deep (through aliases)",
                node.start_mark,
            )
        if known[0] > MAX_NODES:
            raise _Refused(
                f"the document expands to more than {MAX_NODES} values (through aliases)",
                node.start_mark,
            )
        return known

    return walk(root, 1)[0]


_BRACKETS = re.compile(r"[\[\]{}]")


def _flow_depth(text: str) -> None:
    """PyYAML's scanner looks ahead to the end of a flow collection (`[`, `{`) before the
    composer sees it, in time quadratic in its nesting, so deep flow nesting is refused
    from the text first. Counting brackets inside strings too can only over-count, and only
    a string with dozens of unclosed brackets could trip it."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, match.start()) + 1
                raise _Refused(
                    f"the document is nested more than {MAX_DEPTH} levels deep "
                    f"(brackets, at line {line})"
                )
        elif depth:
            depth -= 1


def _load_yaml(text: str) -> object:
    _flow_depth(text)
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_graph(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _load_yaml_all(text: str, loader_class: type[_StrictLoader]) -> list[object]:
    """Every document of a multi-document stream, under the same bounds, with MAX_NODES
    counted over the whole stream (many small alias bombs are one big one)."""
    _flow_depth(text)
    loader = loader_class(text)
    try:
        docs: list[object] = []
        total = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            total += _check_graph(node)
            if total > MAX_NODES:
                raise _Refused(
                    f"the documents expand to more than {MAX_NODES} values together",
                    node.start_mark,
                )
            docs.append(loader.construct_document(node))
        return docs
    finally:
        loader.dispose()


def _json_int(digits: str) -> int:
    if len(digits) > MAX_INT_DIGITS:
        raise _Refused(
            f"an integer of {len(digits)} characters; at most {MAX_INT_DIGITS} are accepted"
        )
    return int(digits)


def _json_depth(doc: object) -> None:
    """JSON is parsed by the C scanner (no composed graph to check first); its depth is
    checked afterwards, without recursion."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if level > MAX_DEPTH:
            raise _Refused(f"the document is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, level + 1) for v in value)


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


def _json_pairs(pairs: list[tuple[str, Any]]) -> Json:
    out: Json = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key, 0, 0)
        out[key] = value
    return out


def load_document(text: str, source: str = "<config>") -> object:
    """The document a config text holds (YAML or JSON), within the bounds above; anything
    else is a ConfigError."""
    return _guarded(lambda: _load(text, source, many=False), source)


def load_documents(text: str, source: str = "<config>", *, timestamps: bool = True) -> list[object]:
    """Every document of a YAML stream (a `kubectl apply -f` file often holds a Namespace
    and the ConfigMap), within the same bounds; used by the file reader to recognise
    ConfigMap manifests and Helm values, and for Kubernetes manifests read as Kubernetes
    reads them (`timestamps=False`: a date-like scalar stays a string). JSON is one
    document."""
    loader_class = _StrictLoader if timestamps else _PlainDatesLoader
    docs = _guarded(lambda: _load(text, source, many=True, loader_class=loader_class), source)
    assert isinstance(docs, list)
    return docs


_T = TypeVar("_T")


def _guarded(load: Callable[[], _T], source: str) -> _T:
    try:
        return load()
    except ConfigError:
        raise
    except Exception as exc:  # whatever a loader raises is a rejection
        raise ConfigError([FieldProblem("", _unexpected(exc))], source=source) from None


def _unexpected(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return _TOO_DEEP
    if isinstance(exc, MemoryError):
        return "the document is too large to load"
    detail = str(exc)
    if len(detail) > 200:
        detail = detail[:200] + "..."
    return f"cannot load the document ({type(exc).__name__}: {detail})"


def _load(
    text: str, source: str, *, many: bool, loader_class: type[_StrictLoader] = _StrictLoader
) -> object:
    """One document, or with `many` the list of a stream's documents."""
    try:
        if text.lstrip().startswith("{"):
            try:
                doc = json.loads(text, object_pairs_hook=_json_pairs, parse_int=_json_int)
            except json.JSONDecodeError:
                pass  # YAML flow style also starts with "{"; let the YAML parser judge it
            else:
                _json_depth(doc)
                return [doc] if many else doc
        return _load_yaml_all(text, loader_class) if many else _load_yaml(text)
    except _Refused as exc:
        raise ConfigError([FieldProblem("", exc.message + _at(exc.mark))], source=source) from None
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


_EMPTY_WHEN_NULL = frozenset({("sharing", "timeSlicing")})
"""`timeSlicing:` with nothing under it is refused as an empty block, as NVIDIA does: its
`Sharing.TimeSlicing` is a struct value, so encoding/json hands the null to
`ReplicatedResources.UnmarshalJSON`, which finds no resources ("no resources specified",
`api/config/v1/replicas.go`). `Sharing.MPS` is a pointer, so a null `mps:` is left nil there:
nothing is shared by MPS, and here it is unset like any other null key."""


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
    except ValidationError as exc:
        raise ConfigError(problems_from(Config, exc), source=source) from None
    except Exception as exc:  # a validator's surprise is still a rejection
        raise ConfigError([FieldProblem("", _unexpected(exc))], source=source) from None


def parse_config(text: str, source: str = "<config>") -> Config:
    """Parse and validate a `version: v1` config. An empty text is the all-defaults config
    (the Helm `config.map` entry `default: |-` with nothing after it)."""
    return validate_document(load_document(text, source), source)
