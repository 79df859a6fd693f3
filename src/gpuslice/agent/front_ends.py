"""The front ends a node may serve its GPUs through, by registration: the first whose
settings group the settings carry is the one that runs (`FrontEndKind.selected`), the
device plugin last as the default. The agent's composition (`agent.build`), the node lock
(`agent.node_lock`) and `gpuslice plugin`'s start line ask this registry which front end
runs; nothing else does. A new front end is one module with its `FrontEndKind` and one
line here (docs/architecture.md, "Adding things")."""

from __future__ import annotations

from gpuslice.agent import dra_front, front
from gpuslice.agent.front import FrontEndKind
from gpuslice.agent.settings import AgentSettings

FRONT_ENDS: tuple[FrontEndKind, ...] = (
    dra_front.KIND,
    front.DEVICE_PLUGIN,
)


def front_end_of(settings: AgentSettings) -> FrontEndKind:
    """The registered front end the settings select."""
    return next(kind for kind in FRONT_ENDS if kind.selected(settings))
