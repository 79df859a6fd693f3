"""The memory guard on an idle node: after a poll that found no process on any GPU it waits
on the idle probe (a thread asking the backend) instead of its timer, and polls again as
soon as a process appears."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from gpuslice.agent.guard_view import IDLE_VIEW, idle_probe
from gpuslice.core.guard import GuardParams, Reserve
from gpuslice.guard import GuardView, MemoryGuard
from gpuslice.testing.eventually import eventually

GIB = 2**30


async def ticks(count: int, interval_s: float) -> None:
    """`count` turns of the loop, each at least `interval_s` apart (rounds, not a duration)."""
    for _ in range(count):
        await asyncio.sleep(interval_s)


class Backend:
    """Only what the probe asks: the GPU processes (thread-safe, as NVML is)."""

    def __init__(self) -> None:
        self.busy = threading.Event()
        self.asked = 0

    def processes(self) -> list[Any]:
        self.asked += 1
        return [object()] if self.busy.is_set() else []


async def test_the_probe_returns_when_a_process_appears() -> None:
    backend = Backend()
    stop = asyncio.Event()
    waiting: asyncio.Task[None] = asyncio.create_task(idle_probe(backend)(stop, 0.02))  # type: ignore[arg-type]
    # Three rounds of asking (on its own thread while idle), none of which saw a process:
    # the probe must still be waiting after each of them.
    await eventually(lambda: backend.asked >= 3, "three rounds of asking while idle")
    assert not waiting.done()
    backend.busy.set()
    await asyncio.wait_for(waiting, 2)


async def test_the_probe_returns_at_stop() -> None:
    stop = asyncio.Event()
    backend = Backend()
    waiting: asyncio.Task[None] = asyncio.create_task(idle_probe(backend)(stop, 0.02))  # type: ignore[arg-type]
    await eventually(lambda: backend.asked >= 1, "the probe waiting (it asked once)")
    stop.set()
    await asyncio.wait_for(waiting, 2)


async def test_an_idle_guard_waits_on_the_probe_not_its_timer() -> None:
    reads = 0
    busy = asyncio.Event()
    idle_waits = 0

    async def read() -> GuardView | None:
        nonlocal reads
        reads += 1
        return IDLE_VIEW

    async def idle_wait(stop: asyncio.Event, interval_s: float) -> None:
        nonlocal idle_waits
        idle_waits += 1
        waits = [asyncio.ensure_future(busy.wait()), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        busy.clear()

    guard = MemoryGuard(
        read=read,
        params=GuardParams(mode="enforce", reserve=Reserve(bytes=4 * GIB), grace_s=0),
        interval_s=0.01,
        idle_wait=idle_wait,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(guard.run(stop))
    await eventually(lambda: idle_waits == 1, "the guard in its idle wait")
    # Twenty of the guard's intervals counted by a ticker on the same loop and clock: each
    # tick is at least one interval, so a timer would have polled at least twenty times by
    # the last one, however slow the machine.
    await ticks(20, 0.01)
    assert (reads, idle_waits) == (1, 1)
    busy.set()  # the probe saw a process: poll again at once
    await eventually(lambda: idle_waits == 2, "one poll, then the idle wait again")
    assert (reads, idle_waits) == (2, 2)
    stop.set()
    await asyncio.wait_for(running, 2)
