"""Loaded by the daemon process in `test_shutdown.py` only (it is put first on PYTHONPATH):
makes the next config reload block the event loop in a system call, as a FIFO at the config
path once did, so that SIGTERM and the watchdog are tested against a loop that is stuck."""

from __future__ import annotations

import os
import time

_MARKER = os.environ.get("GPUSLICE_TEST_BLOCK_RELOAD")

if _MARKER:
    from gpuslice.agent import runner

    async def _blocking_reload(self: runner.Agent, reason: str, expect: object = None) -> bool:
        with open(_MARKER, "w") as f:  # noqa: ASYNC230 - deliberately blocking
            f.write(reason)
        time.sleep(3600)  # noqa: ASYNC251 - the fault under test: a loop that does not answer
        return False

    runner.Agent.reload = _blocking_reload  # type: ignore[method-assign]
