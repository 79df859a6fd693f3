"""Building an agent from settings: opens the backend and wires the optional adapters.

Kept apart from `runner` so tests and the demo can hand the agent their own doubles
(a simulated backend, an emulated kubelet) while `gpuslice plugin` gets the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpuslice.agent.runner import Agent, AgentHooks
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend


@asynccontextmanager
async def build_agent(settings: AgentSettings) -> AsyncIterator[Agent]:
    backend = await asyncio.to_thread(open_backend, settings.node)
    try:
        yield Agent(settings, backend, hooks=AgentHooks())
    finally:
        await asyncio.to_thread(backend.close)
