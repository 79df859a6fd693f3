"""Removing a daemon that hangs at its start: the manager gives the start up at once (not
after its start timeout) and stopping it holds up no other resource's daemon. This is what
lets a DRA claim whose Prepare was cancelled be undone promptly while other claims start
their daemons. The hang is the fake control program's hold directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpuslice.emulator.fake_mps_control import HOLD_ENV
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.mps.control import process_alive

from .conftest import FAKE_CONTROL, wait_until
from .test_mps_manager import spec_for

BOUND_S = 30.0


def _pid_in(pipe_dir: str) -> int:
    return int((Path(pipe_dir) / "nvidia-cuda-mps-control.pid").read_text())


def _hold(hold_dir: Path, pipe_dir: str) -> Path:
    path = hold_dir / Path(pipe_dir).parent.name
    path.touch()
    return path


async def test_a_daemon_hung_at_its_start_is_given_up_and_holds_no_other(sock_dir: Path) -> None:
    hold_dir = sock_dir / "hold"
    hold_dir.mkdir()
    held = spec_for(sock_dir / "mps", name="example.com/held", index=0)
    other = spec_for(sock_dir / "mps", name="example.com/other", index=1)
    _hold(hold_dir, held.pipe_dir)
    manager = MpsDaemonManager(
        [held],
        ControlProgram.factory(
            FAKE_CONTROL, env={**os.environ, HOLD_ENV: str(hold_dir)}, quit_grace_s=10.0
        ),
        # far beyond the test's own timeout: only giving the start up ends it in time
        timings=MpsTimings(start_timeout_s=600.0, start_poll_s=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        pid_file = Path(held.pipe_dir) / "nvidia-cuda-mps-control.pid"
        for _ in range(int(BOUND_S / 0.05)):
            if pid_file.exists():
                break
            await asyncio.sleep(0.05)
        pid = _pid_in(held.pipe_dir)
        assert not manager.ready(held.resource)
        # removing it: its daemon cannot hear `quit`, so it is killed after the grace period
        removing = asyncio.create_task(manager.reconfigure([]))
        await asyncio.sleep(0)
        # meanwhile another resource's daemon starts and answers
        await asyncio.wait_for(manager.reconfigure([other]), BOUND_S)
        await wait_until(manager, lambda: manager.ready(other.resource), BOUND_S)
        assert not removing.done()
        await asyncio.wait_for(removing, BOUND_S)
        assert not process_alive(pid)
        assert manager.specs == (other,)
        assert not any("failed to start" in p for p in manager.problems)
    finally:
        stop.set()
        await task
