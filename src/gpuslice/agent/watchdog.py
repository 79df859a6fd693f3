"""Shutdown that does not depend on the event loop, and a watchdog that says when it stalls.

A signal handler registered with `loop.add_signal_handler` only runs when the loop gets
round to it, so a loop blocked in a system call or a long computation ignored SIGTERM and
the kubelet had to SIGKILL the daemon, leaving its sockets behind. Here the handler is a
plain `signal.signal` handler: Python runs it on the main thread between bytecodes (or
when a blocking call is interrupted), it starts the hard-exit timer thread itself and only
then asks the loop, thread-safely, to stop. Whatever the loop is doing, the process ends
within the deadline.

The watchdog is a thread that pings the loop; when a ping goes unanswered for longer than
`threshold_s` it logs the loop thread's stack once per stall, so the cause of a stall is in
the log rather than guessed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
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
    """Logs, with the loop thread's stack, when the loop answers no ping for `threshold_s`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold_s: float = 1.0) -> None:
        self.loop = loop
        self.threshold_s = threshold_s
        self.loop_thread = threading.get_ident()
        """Constructed on the loop's thread (the daemon's main thread)."""
        self.stalls = 0
        self._answered = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=2.0)

    def _answer(self) -> None:
        self._answered = time.monotonic()

    def _watch(self) -> None:
        # Two pings per threshold (two wake-ups of this thread and of the loop when all is
        # well): a stall is reported 1.5 to 2 thresholds after it began.
        interval = self.threshold_s / 2
        reported = False
        while not self._done.wait(interval):
            try:
                self.loop.call_soon_threadsafe(self._answer)
            except RuntimeError:
                return  # loop closed
            silent = time.monotonic() - self._answered
            if silent <= self.threshold_s + interval:
                reported = False
                continue
            if reported:
                continue
            reported = True
            self.stalls += 1
            frame = sys._current_frames().get(self.loop_thread)
            stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)\n"
            log.warning(
                "loop-blocked",
                silent_s=round(silent, 1),
                threshold_s=self.threshold_s,
                stack=stack.rstrip(),
            )
