"""The node's plan, built in one place: the daemon, `gpuslice describe` and the demo call
`plan_node`, so what describe prints is what the daemon serves.

The core's `build_plan` is pure; what it needs from the host (which IMEX channels exist)
and from the agent's flags (soft limits) is gathered here into `HostFacts` and handed in,
never patched onto the plan afterwards.
"""

from __future__ import annotations

from gpuslice.agent.imex import present_channels
from gpuslice.agent.settings import AgentSettings
from gpuslice.core.config import Config
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import HostFacts, Plan
from gpuslice.core.sharing.plan import build_plan


def host_facts(config: Config, settings: AgentSettings) -> HostFacts:
    """Looks on this host for the config's IMEX channels (raises `ImexChannelMissing` when
    a required one is absent) and takes the soft-limits flag from the settings."""
    return HostFacts(
        imex_channels=present_channels(config),
        memory_soft_limits=settings.memory_guard.soft_limits,
    )


def plan_node(inventory: Inventory, config: Config, settings: AgentSettings) -> Plan:
    """The plan this node serves with `config` (raises PlanError / ImexChannelMissing)."""
    return build_plan(inventory, config, host_facts(config, settings))
