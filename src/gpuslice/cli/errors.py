"""How every command reports bad input: one `error: ...` line on stderr and exit code 2.

Its own module so that the subcommands and `cli.main`, which registers them, both import it
and neither imports the other.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from gpuslice.core.errors import GpusliceError
from gpuslice.ports import BackendError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    """A bad value click found (a flag or its variable): the same one `error:` line and
    exit code as every other bad input, not click's usage block."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file: object = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def reports_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn expected errors into `error: ...` on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (GpusliceError, BackendError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper
