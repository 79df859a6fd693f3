"""Waiting for "this, unless we are told to stop" without leaving tasks behind."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def unless_stopped(stop: asyncio.Event, coro: Coroutine[Any, Any, T]) -> T | None:
    """Await `coro`; return None instead if `stop` is set first (the coroutine is cancelled)."""
    if stop.is_set():
        coro.close()
        return None
    work = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((work, stopper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, stopper):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if work.cancelled() or not work.done():
        return None
    return work.result()


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True if `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
