"""Shutdown that does not depend on the event loop, and a watchdog that says when it stalls.

A signal handler registered with `loop.add_signal_handler` only runs when the loop gets
round to it, so a loop blocked in a system call or a long computation ignored SIGTERM and
the kubelet had to SIGKILL the daemon, leaving its sockets behind. Here the handler is a
plain `signal.signal` handler: Python runs it on the main thread between bytecodes (or
when a blocking call is interrupted), it starts the hard-exit timer thread itself and only
then asks the loop, thread-safely, to stop. Whatever the loop is doing, the process ends
within the deadline.

The watchdog is a thread that learns from the loop's selector when the loop stops waiting
for I/O; when one turn of the loop runs longer than `threshold_s` it logs the loop thread's
stack once per stall, so the cause of a stall is in the log rather than guessed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import selectors
import signal
import sys
import threading
import time
import traceback
from types import FrameType

from gpuslice.logs import get_logger

log = get_logger("gpuslice.agent")

HARD_EXIT_CODE = 1
"""Exit status when the deadline passes before a clean stop (a clean stop exits 0)."""


def install_shutdown_signals(
    loop: asyncio.AbstractEventLoop,
    stop: asyncio.Event,
    grace_s: float,
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT),
) -> None:
    """On the first of `signals`: arm a hard exit `grace_s` later, then set `stop` through
    the loop. Must be called from the main thread (Python runs signal handlers there)."""
    armed = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if not armed.is_set():
            armed.set()
            timer = threading.Timer(grace_s, _hard_exit, args=(grace_s,))
            timer.daemon = True
            timer.start()
        log.info("signal", signal=signal.Signals(signum).name)
        # a closed loop raises RuntimeError: the timer still ends the process
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop.set)

    for sig in signals:
        signal.signal(sig, handler)


def _hard_exit(grace_s: float) -> None:
    log.error("hard-exit", waited_s=grace_s, message="the loop did not stop in time")
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # exiting regardless
            handler.flush()
    os._exit(HARD_EXIT_CODE)


class LoopWatchdog:
    """Logs, with the loop thread's stack, when one turn of the loop runs longer than
    `threshold_s`.

    It used to ping the loop twice per threshold, which woke the loop and this thread four
    times a second on an idle daemon. Now the loop's selector tells it when the loop leaves
    its wait for I/O and when it goes back: a loop waiting in the selector is idle, not
    stalled, so this thread sleeps (no timeout) until the loop has work, then looks every
    threshold for as long as the loop keeps having work. An idle loop costs nothing; a loop
    with work costs this thread one wake-up a threshold, however many turns it runs (it
    used to be two per turn after a wait). Build the loop with `loop_factory` so that its
    selector reports to this watchdog.
    """

    def __init__(self, threshold_s: float = 1.0) -> None:
        self.threshold_s = threshold_s
        self.loop_thread: int | None = None
        """The thread that runs the loop (set the first time it waits in the selector)."""
        self.stalls = 0
        self._busy_since: float | None = time.monotonic()
        """When the loop last left the selector; None while it waits there."""
        self._busy = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def loop_factory(self) -> asyncio.AbstractEventLoop:
        """A loop whose selector tells this watchdog when the loop waits and when it runs."""
        return asyncio.SelectorEventLoop(_WatchedSelector(self))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._busy.set()
        self._thread.join(timeout=2.0)

    def waiting(self) -> None:
        """The loop is about to wait in its selector (called on the loop's thread)."""
        if self.loop_thread is None:
            self.loop_thread = threading.get_ident()
        self._busy_since = None

    def running(self) -> None:
        """The loop left its selector and runs callbacks (called on the loop's thread)."""
        self._busy_since = time.monotonic()
        if not self._busy.is_set():
            self._busy.set()

    def _watch(self) -> None:
        period = self.threshold_s
        reported: float | None = None
        """`_busy_since` of the stall last reported: each stall is logged once."""
        while not self._done.is_set():
            self._busy.wait()  # asleep while the loop only waits for I/O
            self._busy.clear()
            # While the loop keeps having work, look once a period, not at every turn: a
            # loop woken every second (the memory guard's poll) costs this thread one
            # wake-up a period, and a stall is logged 1 to 2 thresholds after its turn
            # began.
            while not self._done.wait(period):
                since = self._busy_since
                if since is not None:
                    silent = time.monotonic() - since
                    if silent > self.threshold_s and reported != since:
                        reported = since
                        self._report(silent)
                    continue
                if not self._busy.is_set():
                    break  # no turn in the last period: sleep until the next one
                self._busy.clear()

    def _report(self, silent: float) -> None:
        self.stalls += 1
        frame = sys._current_frames().get(self.loop_thread) if self.loop_thread else None
        stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)\n"
        log.warning(
            "loop-blocked",
            silent_s=round(silent, 1),
            threshold_s=self.threshold_s,
            stack=stack.rstrip(),
        )


class _WatchedSelector(selectors.DefaultSelector):
    """The loop's own selector, telling the watchdog when the loop waits and runs."""

    def __init__(self, watchdog: LoopWatchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # Also around a poll (timeout 0, callbacks ready): each turn of the loop restarts
        # the watchdog's clock, so a loop busy with many short turns is not a stall.
        self._watchdog.waiting()
        try:
            return super().select(timeout)
        finally:
            self._watchdog.running()
