"""Running a clean-up or a write to its end even when the caller is cancelled.

The kubelet's deadline (and the agent's shutdown) cancel a Prepare by raising
`asyncio.CancelledError` at whatever it awaits. `CancelledError` is a BaseException, so an
`except Exception` undo never runs, and an undo that is itself interrupted leaves half of a
claim behind (an MPS daemon nobody will stop, a CDI spec, a record). What goes through
`to_the_end` runs in its own task that the cancellation cannot reach; the caller waits for
it, and the cancellation is raised to the caller only once it is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_running: set[asyncio.Task[Any]] = set()
"""Strong references: the event loop keeps only weak ones to tasks."""


async def to_the_end(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` to its end, shielded; a cancellation that came meanwhile is raised after."""
    task = asyncio.ensure_future(work)
    _running.add(task)
    task.add_done_callback(_running.discard)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():  # `work` itself was cancelled, or raised this
                raise
            cancelled = True  # ours: wait on, and pass it on once the work is over
    if cancelled:
        raise asyncio.CancelledError
    return result
