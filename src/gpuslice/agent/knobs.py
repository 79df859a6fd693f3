"""A daemon setting is defined once: as a settings field carrying its knob.

Each field of the settings dataclasses (`agent.settings`) that `gpuslice plugin` can be
told is declared with `knob(...)`: its default (the field's, the only one), its flag names,
its environment variable and its help. `cli.plugin` generates its command from these
fields, as do the other commands that take a daemon setting (`cli.common.daemon_option`);
`scripts/gen-chart-knobs` writes a new one's chart value, template line, schema entry and
`extraEnv` checks and its docs' row, and the drift tests hold what is written to them, so a
new setting is one field and nothing else can fall out of step.

Knobs without flags (`POD_NAME`, `DP_*` and the like, set by the downward API or NVIDIA's
manifests) are read from the environment in one place, `settings_from_cli`'s caller in
`cli.plugin`, through the same table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field
from typing import Any, Final

UNSET: Final = object()
"""`cli_default` not given: the flag's default is the field's."""


@dataclass(frozen=True, slots=True)
class Knob:
    flags: tuple[str, ...]
    """Flag names as click takes them (`--gpu-metrics/--no-gpu-metrics`, aliases); empty:
    the setting is read from `env` only."""
    env: str | None = None
    help: str | None = None
    type: Any = None
    """The click parameter type (a range, a path, a choice) or None for click's guess."""
    show_default: bool | None = None
    is_flag: bool = False
    hidden: bool = False
    to_cli: Callable[[Any], Any] | None = None
    """The field's default as the flag spells it (a tuple joined with commas)."""
    from_cli: Callable[[Any], Any] | None = None
    """The flag's value as the field holds it (a command line split into words)."""
    cli_default: Any = UNSET
    """A flag default that is no field value: None where a rule between settings decides
    (`--kubelet-socket` defaults to a path under `--device-plugin-path`)."""
    overrides: str | None = None
    """The config path the flag overrides when set (NVIDIA's `flags.migStrategy`...)."""
    chart: str | None = None
    """The Helm value the chart passes as `env` (`metrics.port`): an error about the
    setting names it, since a chart user never typed the flag or the variable."""

    @property
    def flag(self) -> str | None:
        """The flag as a user names it (`--gpu-metrics` of `--gpu-metrics/--no-gpu-metrics`);
        None for a setting read from `env` only."""
        return self.flags[0].split("/")[0] if self.flags else None

    def names(self) -> str:
        """Every name a user may have set this by, for an error message:
        `--metrics-port (METRICS_PORT; chart value metrics.port)`."""
        flag = self.flag
        chart = None if self.chart is None else f"chart value {self.chart}"
        inner = "; ".join(n for n in (self.env, chart) if n)
        if flag is None:
            return inner
        return f"{flag} ({inner})" if inner else flag


def knob(
    default: Any = MISSING,
    *flags: str,
    factory: Callable[[], Any] | None = None,
    env: str | None = None,
    help: str | None = None,
    type: Any = None,
    show_default: bool | None = None,
    is_flag: bool = False,
    hidden: bool = False,
    to_cli: Callable[[Any], Any] | None = None,
    from_cli: Callable[[Any], Any] | None = None,
    cli_default: Any = UNSET,
    overrides: str | None = None,
    chart: str | None = None,
) -> Any:
    """A dataclass field with its knob (`Knob`) in the metadata."""
    meta = {
        "knob": Knob(
            flags,
            env,
            help,
            type,
            show_default,
            is_flag,
            hidden,
            to_cli,
            from_cli,
            cli_default,
            overrides,
            chart,
        )
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class KnobField:
    name: str
    knob: Knob
    default: Any

    @property
    def cli_default(self) -> Any:
        if self.knob.cli_default is not UNSET:
            return self.knob.cli_default
        return self.default if self.knob.to_cli is None else self.knob.to_cli(self.default)

    def value(self, given: Any) -> Any:
        """The field's value for what the flag (or its variable) gave."""
        return given if self.knob.from_cli is None else self.knob.from_cli(given)


def knobs(cls: type) -> Iterator[KnobField]:
    """The fields of a settings dataclass that carry a knob, in declaration order."""
    for f in dataclasses.fields(cls):
        found = f.metadata.get("knob")
        if found is None:
            continue
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = None
        yield KnobField(f.name, found, default)


def knob_field(cls: type, name: str) -> KnobField:
    """One field with its knob (`knob_field(AgentSettings, "node")`): what a command other
    than `gpuslice plugin` takes the daemon's option from."""
    for f in knobs(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__}.{name} carries no knob")


def knob_of(cls: type, name: str) -> Knob:
    """The knob of one field (`knob_of(AgentSettings, "metrics_port")`), for messages that
    name the setting as the user may have given it."""
    return knob_field(cls, name).knob
