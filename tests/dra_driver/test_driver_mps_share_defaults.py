"""MPS shares held whatever their env says: the GPU's share daemon runs with defaults no
larger than the largest share prepared on it (a client that unsets `CUDA_MPS_*` gets those,
not the whole GPU), raised before a larger share's Prepare returns (its clients' env can
only lower them) and lowered when it goes, sent to the running daemon, never restarted.
The driver in-process, the fake control program answering as the real one does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuslice.core.dra.claims import share_daemon_key
from gpuslice.core.dra.publish import REPLICAS
from gpuslice.core.mps import pinned_limit_shown
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from tests.dra_driver.test_driver_share_modes import FAKE_MPS, MPS_4, make_node


@pytest.fixture
async def daemons() -> AsyncIterator[MpsDaemonManager]:
    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(FAKE_MPS),
        timings=MpsTimings(health_interval_s=0.5, start_poll_s=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield manager
    finally:
        stop.set()
        await task


async def _defaults(control: ControlProgram) -> tuple[str, str]:
    return (
        await control.send("get_default_active_thread_percentage"),
        await control.send("get_default_device_pinned_mem_limit 0"),
    )


async def test_the_share_daemon_serves_no_more_than_the_largest_share(
    sock_dir: Path, daemons: MpsDaemonManager
) -> None:
    node = await make_node(sock_dir, REPLICAS, MPS_4)
    node.mps = daemons
    driver = node.driver()
    await driver.load()
    gpu = node.state.current.inventory.gpus[0]
    quarter = gpu.memory_mib // 4
    pipe = sock_dir / "mps" / share_daemon_key(gpu.uuid)
    control = ControlProgram(pipe / "pipe", pipe / "log", command=FAKE_MPS)

    small = node.claim("small")
    assert (await driver.prepare([small]))[small.uid].error == ""
    assert await _defaults(control) == ("25.0", pinned_limit_shown(quarter))
    pid = control.daemon_pid()

    large = node.claim("large", memory="40Gi", cores="50")
    assert (await driver.prepare([large]))[large.uid].error == ""
    assert node.env(large)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert await _defaults(control) == ("50.0", "40G")  # the large share's own clients fit

    assert await driver.unprepare([large]) == {large.uid: ""}
    assert await _defaults(control) == ("25.0", pinned_limit_shown(quarter))
    assert control.daemon_pid() == pid  # never restarted: the small share's clients go on
    await driver.unprepare([small])
