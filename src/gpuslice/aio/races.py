"""Waiting for the first of several things, and leaving nothing behind.

`asyncio.wait(..., FIRST_COMPLETED)` returns with the losers still running: each caller
then has to cancel them, and to wait for the cancellation, or a loser outlives its caller
(a pending `stop.wait()` per loop turn, a "Task was destroyed but it is pending" at exit)
and an exception nobody retrieved is logged at garbage collection. `first_of` does that
once for every caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first_of(
    *waits: Awaitable[Any], within_s: float | None = None
) -> tuple[asyncio.Future[Any], ...]:
    """Run `waits` until the first of them ends, or `within_s` seconds pass (no error
    then), then cancel the others and wait until they are gone. Returns the futures in the
    order given: each is done, the first with its result (or exception), the others
    cancelled unless they ended in the same step. A task passed in keeps its name; it is
    cancelled like the rest. Cancelling the caller cancels them all."""
    futures = tuple(asyncio.ensure_future(w) for w in waits)
    try:
        await asyncio.wait(futures, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
        # the losers' cancellation and any exception are collected here, not at exit
        await asyncio.gather(*futures, return_exceptions=True)
    return futures
