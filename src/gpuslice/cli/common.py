"""Pieces several commands share: the daemon's options, opening the node and computing the
plan from files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from gpuslice.agent.configs import load_config
from gpuslice.agent.knobs import KnobField, knob_field
from gpuslice.agent.plan import plan_node
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.core.config import Config
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import Plan
from gpuslice.ports import GpuBackend

FC = TypeVar("FC", bound=Callable[..., Any])


def _option_args(f: KnobField) -> tuple[list[str], dict[str, Any]]:
    k = f.knob
    extra: dict[str, Any] = {}
    if k.is_flag:
        extra["is_flag"] = True
    if k.type is not None:
        extra["type"] = k.type
    return list(k.flags), {
        "envvar": k.env,
        "show_envvar": k.env is not None,
        "default": f.cli_default,
        "show_default": k.show_default,
        "help": k.help,
        "hidden": k.hidden,
        **extra,
    }


def knob_option(f: KnobField) -> click.Option:
    """The click option of a settings field's knob: `gpuslice plugin`'s, and the one every
    other command that takes the same setting gets (`daemon_option`), so a flag, its
    variable, its default and its help cannot differ between commands."""
    decls, attrs = _option_args(f)
    return click.Option(decls, **attrs)


def daemon_option(group: type, name: str) -> Callable[[FC], FC]:
    """A command decorator adding `gpuslice plugin`'s option for one settings field
    (`daemon_option(AgentSettings, "node")`): `describe` and `labels` take the daemon's
    knobs as the daemon does instead of declaring their own copies."""
    decls, attrs = _option_args(knob_field(group, name))
    return click.option(*decls, **attrs)


@dataclass(frozen=True, slots=True)
class NodeView:
    inventory: Inventory
    config: Config
    config_name: str
    plan: Plan
    backend_name: str


def plan_for(
    node: str,
    config_path: Path | None,
    config_name: str = "",
    backend: GpuBackend | None = None,
    *,
    default_config: str = "",
) -> NodeView:
    """What a node would advertise with a config: no sockets, no daemons. Uses `backend`
    when the caller already holds one open, else opens and closes the node's own.
    `default_config`: the named config of a node without the label, as the daemon picks it
    (`DEFAULT_CONFIG`), so that in the agent's pod the offline commands show its config."""
    if backend is None:
        own = open_backend(node)
        try:
            return plan_for(node, config_path, config_name, own, default_config=default_config)
        finally:
            own.close()
    inventory = backend.inventory()
    name = backend.name
    settings = AgentSettings(
        node=node, config_path=config_path, config_name=config_name, default_config=default_config
    )
    loaded = load_config(settings)
    plan = plan_node(inventory, loaded.config, settings)  # the daemon's own plan builder
    return NodeView(inventory, loaded.config, loaded.name, plan, name)


def console() -> Console:
    """A terminal's own width, or 140 columns when piped (CI logs, `| less`): rich's
    80-column default folds the tables until they cannot be read."""
    con = Console()
    return con if con.is_terminal else Console(width=140)
