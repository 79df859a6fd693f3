"""Wait until something holds, for tests: one helper instead of a poll loop per test module.

Tests wait on things another process or task makes true (a daemon writes a file, a server
sees a request). Each module used to carry its own loop with its own deadline, sleep and
failure message; they drifted (some raised `TimeoutError` with no word on what was awaited,
one gave up silently after a fixed number of tries). Here the failure always names what was
awaited and, when the caller gives one, the last state seen (`explain`), so a timeout on a
slow CI machine says what was missing rather than only that time ran out.

The timeout bounds a wait for a positive event; it is never used to conclude that something
did NOT happen (absence is checked by rounds: wait for N further rounds of the thing that
would have caused it, then assert).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.05


class NeverHeld(AssertionError):
    """`eventually` ran out of time; an AssertionError so pytest reports it as a failure."""


def _message(what: str, timeout: float, explain: Callable[[], str] | None) -> str:
    text = f"timed out after {timeout:g}s waiting for {what}"
    if explain is not None:
        text += f"\n{explain()}"
    return text


async def eventually(
    predicate: Callable[[], bool],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (the deadline names `what` on failure)
    interval: float = DEFAULT_INTERVAL_S,
    explain: Callable[[], str] | None = None,
    give_up: Callable[[], bool] | None = None,
) -> None:
    """Re-check `predicate` every `interval` seconds on the running loop until it holds.

    Fails with `NeverHeld` naming `what` after `timeout` seconds, or at once when `give_up()`
    says waiting longer is pointless (e.g. the daemon that would make it true has exited).
    `explain()` is called only on failure and its text is appended to the message.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline or (give_up is not None and give_up()):
            raise NeverHeld(_message(what, timeout, explain))
        await asyncio.sleep(interval)


async def eventually_async(
    predicate: Callable[[], Awaitable[bool]],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (as in `eventually`)
    interval: float = DEFAULT_INTERVAL_S,
    explain: Callable[[], str] | None = None,
) -> None:
    """`eventually` for a predicate that must await (an HTTP probe, an API read)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise NeverHeld(_message(what, timeout, explain))
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], bool],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
    explain: Callable[[], str] | None = None,
) -> None:
    """`eventually` for plain (non-async) tests: blocks the calling thread between checks."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise NeverHeld(_message(what, timeout, explain))
        time.sleep(interval)
