"""`-o table|json|yaml` for every command that prints data, like kubectl's.

Scripts should not have to scrape tables; each command builds plain data once and this
module prints it in the asked format. `plain` turns the frozen dataclasses the core returns
into JSON/YAML-safe values, so a new field shows up in `-o json` without extra code.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
import yaml

FORMATS = ("table", "json", "yaml")

F = TypeVar("F", bound=Callable[..., Any])


def output_option(func: F) -> F:
    """The shared `-o/--output` option (parameter name `output`)."""
    option = click.option(
        "-o",
        "--output",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people; json or yaml for scripts.",
    )
    return option(func)


def plain(value: object) -> object:
    """Dataclasses, mappings, tuples and enums as dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [plain(v) for v in items]
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def emit(data: object, output: str) -> None:
    """Print `data` as JSON or YAML (the caller renders `table` itself)."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
    else:
        raise click.UsageError(f"unknown output format {output!r}; use one of {FORMATS}")
