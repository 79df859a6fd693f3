"""Turning pydantic's validation errors into `FieldProblem`s a user can act on.

Pydantic's own texts ("Input should be a valid integer") say neither which value was wrong
in the user's terms nor what would be accepted. Each problem here carries the path in the
user's key spelling (`sharing.timeSlicing.resources[0].replicas`), the bad value, and
NVIDIA's wording where NVIDIA has one, so runbooks written against NVIDIA's plugin match.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpuslice.core.config.fields import show
from gpuslice.core.errors import FieldProblem

_MISSING = {
    ("ReplicatedResource", "name"): "no resource name specified",
    ("ReplicatedResource", "replicas"): "no replicas specified",
    ("ReplicatedResources", "resources"): "no resources specified",
    ("ResourcePattern", "pattern"): "resources must have a 'pattern' field set",
    ("ResourcePattern", "name"): "resources must have a 'name' field set",
}

Loc = Sequence[int | str]


def format_path(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if get_origin(annotation) in (Union, types.UnionType, tuple, list) or get_args(annotation):
        for arg in get_args(annotation):
            yield from _models_in(arg)


def _aliases(model: type[BaseModel]) -> dict[str, str]:
    """alias -> field name."""
    return {(f.alias or name): name for name, f in model.model_fields.items()}


def model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that validates the mapping found at `loc` (list indices skipped)."""
    current: type[BaseModel] | None = root
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        name = _aliases(current).get(part)
        if name is None:
            return None
        current = next(_models_in(current.model_fields[name].annotation), None)
    return current


def unknown_key_message(model: type[BaseModel] | None, key: str) -> str:
    if model is None:
        return "unknown field"
    known = sorted(_aliases(model))
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean '{by_lower[close[0]]}'?"
    return f"unknown field; known fields here: {', '.join(known)}"


def _message(root: type[BaseModel], err: ErrorDetails) -> str:
    kind = err["type"]
    loc = err["loc"]
    value: Any = err.get("input")
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    got = show(value)
    if kind == "gpuslice":
        return str(ctx["message"])
    if kind == "missing":
        model = model_at(root, loc[:-1])
        key = (model.__name__, str(loc[-1])) if model is not None else None
        return (
            _MISSING.get(key, "required field is missing") if key else "required field is missing"
        )
    if kind == "extra_forbidden":
        return unknown_key_message(model_at(root, loc[:-1]), str(loc[-1]))
    if kind == "literal_error":
        return f"invalid value {got}; expected {ctx.get('expected', 'one of the listed values')}"
    if kind == "bool_type":
        return f"expected true or false, got {got}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected a whole number, got {got}"
    if kind == "string_type":
        return f"expected a string, got {got}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping (key: value), got {got}"
    if kind in ("tuple_type", "list_type", "iterable_type"):
        return f"expected a list, got {got}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge')}, got {got}"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le')}, got {got}"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    return f"{err['msg']}, got {got}"


def _path(err: ErrorDetails) -> str:
    path = format_path(err["loc"])
    ctx = err.get("ctx") or {}
    sub = str(ctx.get("subpath", "")) if err["type"] == "gpuslice" else ""
    if sub:
        path = f"{path}{sub}" if not path or sub.startswith("[") else f"{path}.{sub}"
    return path


def problems_from(root: type[BaseModel], error: ValidationError) -> list[FieldProblem]:
    out: list[FieldProblem] = []
    for err in error.errors(include_url=False):
        problem = FieldProblem(_path(err), _message(root, err))
        if problem not in out:
            out.append(problem)
    return out
