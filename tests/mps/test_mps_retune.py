"""A share daemon retuned to no default pinned limit (`MpsDaemonSpec.pinned_cleared`): MPS
has no command that removes one, so the daemon is restarted without it while no MPS server
runs, and keeps it (reported, and expected by its read-back) while one does."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.core.mps import MpsDaemonSpec, pinned_limit_shown
from gpuslice.emulator.fake_mps_control import SERVER_ENV
from gpuslice.mps import ControlProgram, MpsDaemonManager
from gpuslice.testing.logcapture import captured_events

from .conftest import FAKE_CONTROL, wait_until
from .test_mps_manager import FAST, daemon_pid, probe, running, spec_for


@pytest.fixture
def server() -> Iterator[subprocess.Popen[bytes]]:
    """A process the fake daemon lists as its running MPS server."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def share_daemon(root: Path) -> tuple[MpsDaemonSpec, MpsDaemonSpec]:
    """A retunable daemon with a pinned default, and the same daemon wanted without one."""
    spec = dataclasses.replace(spec_for(root), retunable=True)
    assert spec.pinned_mem_limits_mib
    return spec, spec.retuned(50, ())


def manager(spec: MpsDaemonSpec, env: dict[str, str]) -> MpsDaemonManager:
    factory = ControlProgram.factory(FAKE_CONTROL, env=env, quit_grace_s=1.0)
    return MpsDaemonManager([spec], factory, timings=FAST)


async def pinned(spec: MpsDaemonSpec) -> str:
    return (await probe(spec).send("get_default_device_pinned_mem_limit 0")).strip()


async def test_without_a_server_the_daemon_restarts_without_the_limit(sock_dir: Path) -> None:
    spec, lifted = share_daemon(sock_dir)
    mps = manager(spec, dict(os.environ))
    async with running(mps):
        await wait_until(mps, lambda: mps.ready(spec.resource), 10)
        before = daemon_pid(spec)
        assert await pinned(spec) == pinned_limit_shown(spec.pinned_mem_limits_mib[0][1])
        await mps.reconfigure([lifted])
        await wait_until(mps, lambda: mps.ready(spec.resource), 10)
        assert await pinned(spec) == ""  # no limit
        assert (await probe(spec).send("get_default_active_thread_percentage")).strip() == "50.0"
        assert daemon_pid(spec) not in (None, before)


async def test_with_a_server_the_limit_is_kept_and_reported(
    sock_dir: Path, server: subprocess.Popen[bytes]
) -> None:
    spec, lifted = share_daemon(sock_dir)
    mps = manager(spec, {**os.environ, SERVER_ENV: str(server.pid)})
    async with running(mps):
        await wait_until(mps, lambda: mps.ready(spec.resource), 10)
        before = daemon_pid(spec)
        with captured_events() as events:
            await mps.reconfigure([lifted])
        shown = pinned_limit_shown(spec.pinned_mem_limits_mib[0][1])
        assert await pinned(spec) == shown  # kept: its clients go on
        assert (await probe(spec).send("get_default_active_thread_percentage")).strip() == "50.0"
        assert daemon_pid(spec) == before
        assert mps.ready(spec.resource)
        (kept,) = [p for p in mps.problems if "keeps its default pinned memory limit" in p]
        assert f"server {server.pid}" in kept
        assert [e["event"] for e in events if e["event"] == "mps-problem"] == ["mps-problem"]
