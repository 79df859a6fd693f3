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

GIB = 2**30


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
    waiting = asyncio.create_task(idle_probe(backend)(stop, 0.02))  # type: ignore[arg-type]
    await asyncio.sleep(0.2)
    assert not waiting.done()
    assert backend.asked >= 3, "asked on its own thread while idle"
    backend.busy.set()
    await asyncio.wait_for(waiting, 2)


async def test_the_probe_returns_at_stop() -> None:
    stop = asyncio.Event()
    waiting = asyncio.create_task(idle_probe(Backend())(stop, 0.02))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
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
    await asyncio.sleep(0.2)  # twenty intervals: a timer would have polled twenty times
    assert (reads, idle_waits) == (1, 1)
    busy.set()  # the probe saw a process: poll again at once
    await asyncio.sleep(0.05)
    assert (reads, idle_waits) == (2, 2)
    stop.set()
    await asyncio.wait_for(running, 2)
