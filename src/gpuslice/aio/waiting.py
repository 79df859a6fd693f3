"""Waiting for "this, unless we are told to stop" without leaving tasks behind."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from gpuslice.aio.races import first_of

T = TypeVar("T")


async def unless_stopped(stop: asyncio.Event, coro: Coroutine[Any, Any, T]) -> T | None:
    """Await `coro`; return None instead if `stop` is set first (the coroutine is cancelled)."""
    if stop.is_set():
        coro.close()
        return None
    work = asyncio.ensure_future(coro)
    await first_of(work, stop.wait())
    if work.cancelled() or not work.done():
        return None
    return work.result()


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True if `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
