"""Re-reading the GPU inventory on a running node, so MIG changes need no restart.

Seed 001: after `nvidia-smi mig -cgi` NVIDIA's plugin crash-loops ("invalid MIG
configuration") until someone deletes its pod. Here a loop re-reads the inventory every
`inventory_interval_s` (a backend's `inventory-changed` event, such as NVML's MIG config
change, makes the agent re-plan at once; this loop catches what no event reports, such as
a MIG mode switch after a GPU reset); when anything changed it re-plans through the agent's
own `reload`, so the same validation and publishing apply as for a config change. A layout
that `migStrategy: single` cannot serve is not an error: the plan advertises nothing for
it, the labels say `-MIG-INVALID`, and a Warning Event says what to change. Once the layout
is fixed the next re-read advertises it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gpuslice.agent.runner import Agent
from gpuslice.logs import get_logger
from gpuslice.ports import BackendError

log = get_logger("gpuslice.agent")

INVALID_REASON = "MigLayoutInvalid"

Warn = Callable[[str, str], Awaitable[None]]
"""Post a Warning (reason, message), e.g. as a Kubernetes Event on the Node."""


def inventory_watcher(
    agent: Agent, warn: Warn | None = None
) -> Callable[[asyncio.Event], Coroutine[Any, Any, None]]:
    """The loop, ready for `AgentHooks.services`."""

    async def watch_inventory(stop: asyncio.Event) -> None:
        await _watch(agent, warn, stop)

    return watch_inventory


async def _watch(agent: Agent, warn: Warn | None, stop: asyncio.Event) -> None:
    posted: str | None = None
    while not stop.is_set():
        posted = await _report_layout(agent, warn, posted)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), agent.settings.inventory_interval_s)
        if stop.is_set():
            return
        state = agent.state
        try:
            inventory = await asyncio.to_thread(agent.backend.inventory)
        except BackendError as exc:
            # a GPU that stops answering is the health loop's business; keep re-reading
            log.warning("inventory-read-failed", error=str(exc))
            continue
        if inventory != state.current.inventory:
            log.info("inventory-changed", message="re-planning")
            await agent.reload("inventory")


async def _report_layout(agent: Agent, warn: Warn | None, posted: str | None) -> str | None:
    """Warn once per distinct layout problem; log when it is gone."""
    problem = agent.state.current.plan.mig_layout_problem
    if problem == posted:
        return posted
    if problem is None:
        log.info("mig-layout-valid")
        return None
    log.warning("mig-layout-invalid", problem=problem)
    if warn is not None:
        try:
            await warn(
                INVALID_REASON,
                f"invalid MIG configuration for migStrategy 'single': {problem}. Nothing is "
                "advertised for it until the layout is fixed; the agent keeps running and "
                "picks the change up by itself",
            )
        except Exception:
            # the Events API being down must not stop the inventory from being re-read
            log.exception("mig-layout-warning-failed")
    return problem
