"""Pieces several commands share: opening the node and computing the plan from files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from gpuslice.agent.configs import load_config
from gpuslice.agent.plan import plan_node
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.core.config import Config
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import Plan
from gpuslice.ports import GpuBackend


@dataclass(frozen=True, slots=True)
class NodeView:
    inventory: Inventory
    config: Config
    config_name: str
    plan: Plan
    backend_name: str


def plan_for(
    node: str, config_path: Path | None, config_name: str = "", backend: GpuBackend | None = None
) -> NodeView:
    """What a node would advertise with a config: no sockets, no daemons. Uses `backend`
    when the caller already holds one open, else opens and closes the node's own."""
    if backend is None:
        own = open_backend(node)
        try:
            return plan_for(node, config_path, config_name, own)
        finally:
            own.close()
    inventory = backend.inventory()
    name = backend.name
    settings = AgentSettings(node=node, config_path=config_path, config_name=config_name)
    loaded = load_config(settings)
    plan = plan_node(inventory, loaded.config, settings)  # the daemon's own plan builder
    return NodeView(inventory, loaded.config, loaded.name, plan, name)


def console() -> Console:
    """A terminal's own width, or 140 columns when piped (CI logs, `| less`): rich's
    80-column default folds the tables until they cannot be read."""
    con = Console()
    return con if con.is_terminal else Console(width=140)
