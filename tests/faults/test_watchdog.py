"""The loop watchdog: a turn of the loop that blocks is reported once, a loop busy with
short turns is not, and an idle loop leaves the watchdog's thread asleep (it is told by the
loop's selector, it no longer pings). The daemon-level test (the stack of a blocked reload
in the log) is in test_shutdown.py."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from gpuslice.agent.watchdog import LoopWatchdog

THRESHOLD_S = 0.1


def _switches(native_id: int) -> int:
    """Context switches of one thread of this process so far (each is a wake-up)."""
    text = Path(f"/proc/self/task/{native_id}/status").read_text()
    return sum(
        int(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"))
    )


def _run(body: object) -> LoopWatchdog:
    assert callable(body)
    watchdog = LoopWatchdog(THRESHOLD_S)
    with asyncio.Runner(loop_factory=watchdog.loop_factory) as runner:
        watchdog.start()
        try:
            runner.run(body(watchdog))
        finally:
            watchdog.stop()
    return watchdog


def test_a_blocked_turn_is_reported_once() -> None:
    async def body(_w: LoopWatchdog) -> None:
        await asyncio.sleep(0)
        time.sleep(THRESHOLD_S * 6)  # noqa: ASYNC251 (blocks the loop: one stall)
        await asyncio.sleep(THRESHOLD_S)

    assert _run(body).stalls == 1


def test_two_blocked_turns_are_two_stalls() -> None:
    async def body(_w: LoopWatchdog) -> None:
        for _ in range(2):
            time.sleep(THRESHOLD_S * 4)  # noqa: ASYNC251 (a stall)
            await asyncio.sleep(THRESHOLD_S)

    assert _run(body).stalls == 2


def test_many_short_turns_are_no_stall() -> None:
    async def body(_w: LoopWatchdog) -> None:
        end = time.monotonic() + THRESHOLD_S * 8
        while time.monotonic() < end:
            time.sleep(THRESHOLD_S / 10)  # noqa: ASYNC251 (a short turn)
            await asyncio.sleep(0)

    assert _run(body).stalls == 0


def test_an_idle_loop_leaves_the_watchdog_thread_asleep() -> None:
    seen: dict[str, int] = {}

    def count(native_id: int) -> None:
        # read from a thread of its own, so the loop stays idle between the two readings
        time.sleep(THRESHOLD_S * 3)  # the watchdog has seen the loop wait and sleeps
        seen["before"] = _switches(native_id)
        time.sleep(THRESHOLD_S * 20)  # a pinging watchdog would wake 40 times here
        seen["after"] = _switches(native_id)

    async def body(_w: LoopWatchdog) -> None:
        thread = next(t for t in threading.enumerate() if t.name == "loop-watchdog")
        assert thread.native_id is not None
        counter = threading.Thread(target=count, args=(thread.native_id,))
        counter.start()
        await asyncio.sleep(THRESHOLD_S * 25)  # one wait in the selector, no turn
        counter.join()

    watchdog = _run(body)
    assert watchdog.stalls == 0
    assert seen["after"] == seen["before"], seen


def test_a_loop_with_regular_work_wakes_the_watchdog_once_a_threshold() -> None:
    """A short turn every fifth of a threshold (the memory guard's poll, say) for 20
    thresholds: about 100 waits and wake-ups of the loop, but the watchdog thread looks once
    a threshold, not at every turn."""
    seen: dict[str, int] = {}

    async def body(_w: LoopWatchdog) -> None:
        thread = next(t for t in threading.enumerate() if t.name == "loop-watchdog")
        assert thread.native_id is not None
        await asyncio.sleep(THRESHOLD_S)
        seen["before"] = _switches(thread.native_id)
        for _ in range(100):
            await asyncio.sleep(THRESHOLD_S / 5)
        seen["after"] = _switches(thread.native_id)

    assert _run(body).stalls == 0
    # one look a threshold (20), with room for a loaded machine; two per turn would be 200
    assert seen["after"] - seen["before"] < 50, seen
