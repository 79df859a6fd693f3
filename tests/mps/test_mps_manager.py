"""The MPS daemon manager against the fake control program: real processes, real files."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpuslice.core.dra.claims import daemon_spec as claim_daemon_spec
from gpuslice.core.mps import MpsDaemonSpec, daemon_spec, pinned_limit_shown
from gpuslice.logs import STRUCTURED_ATTR
from gpuslice.mps import (
    ControlProgram,
    MpsDaemonManager,
    MpsTimings,
)
from gpuslice.mps.control import process_alive
from gpuslice.nvsmi import NvidiaSmi
from gpuslice.testing.eventually import eventually

from .conftest import FAKE_CONTROL, gpu, shared, wait_until

FAST = MpsTimings(health_interval_s=0.2, start_timeout_s=10.0, retry_interval_s=0.5)

FAKE_SMI = """
import pathlib, sys
log, outcome, args = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
with log.open("a") as f:
    f.write(" ".join(args) + "\\n")
if outcome == "fail":
    sys.stderr.write("Insufficient Permissions\\n")
    sys.exit(4)
"""


def spec_for(
    root: Path, replicas: int = 10, name: str = "nvidia.com/gpu", index: int = 0
) -> MpsDaemonSpec:
    spec = daemon_spec(shared([gpu(index)], replicas, name=name), str(root))
    assert spec is not None
    return spec


def probe(spec: MpsDaemonSpec) -> ControlProgram:
    """A second control client, as a user on the node would query the daemon."""
    return ControlProgram(Path(spec.pipe_dir), Path(spec.log_dir), command=FAKE_CONTROL)


def daemon_pid(spec: MpsDaemonSpec) -> int | None:
    return probe(spec).daemon_pid()


def exists(path: str | Path) -> bool:
    return Path(path).exists()


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


def mode(path: str) -> int:
    return Path(path).stat().st_mode & 0o777


def read(path: Path) -> str:
    return path.read_text()


def fake_smi(log: Path, outcome: str) -> NvidiaSmi:
    return NvidiaSmi((sys.executable, "-c", FAKE_SMI, str(log), outcome))


@asynccontextmanager
async def running(manager: MpsDaemonManager) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(manager.run(stop))
        try:
            yield stop
        finally:
            stop.set()


def manager_for(
    specs: Sequence[MpsDaemonSpec],
    *,
    timeout_s: float = 10.0,
    on_readiness: Callable[[str, bool], None] | None = None,
    compute_mode: NvidiaSmi | None = None,
    keep_running: bool = False,
) -> MpsDaemonManager:
    return MpsDaemonManager(
        specs,
        ControlProgram.factory(FAKE_CONTROL, timeout_s=timeout_s, quit_grace_s=1.0),
        compute_mode=compute_mode,
        timings=FAST,
        on_readiness=on_readiness,
        keep_running=keep_running,
    )


async def test_start_applies_limits_and_writes_markers(sock_dir: Path) -> None:
    spec = spec_for(sock_dir)
    seen: list[tuple[str, bool, bool]] = []
    manager = manager_for(
        [spec], on_readiness=lambda r, ok: seen.append((r, ok, exists(spec.ready_marker)))
    )
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        assert is_dir(spec.pipe_dir)
        assert mode(spec.pipe_dir) == 0o755
        assert is_dir(spec.log_dir)
        assert is_dir(spec.shm_dir)
        assert exists(spec.started_marker)
        assert exists(spec.ready_marker)
        pid = daemon_pid(spec)
        assert pid is not None
        control = probe(spec)
        assert await control.send("get_default_device_pinned_mem_limit 0") == "4G"
        sent = read(Path(spec.log_dir) / "control.log")
        assert "set_default_device_pinned_mem_limit 0 4606M" in sent
        assert await control.send("get_default_active_thread_percentage") == "10.0"
    # Stopped: quit was sent, the daemon is gone, the markers are removed.
    assert not process_alive(pid)
    assert not exists(spec.started_marker)
    assert not exists(spec.ready_marker)
    assert not manager.ready(spec.resource)
    assert "Command: quit" in read(Path(spec.log_dir) / "control.log")
    # The agent heard every transition, with `.ready` already matching when it did.
    r = spec.resource
    assert seen == [(r, False, False), (r, True, True), (r, False, False)]


async def test_crash_is_signalled_and_the_daemon_restarted_with_limits(sock_dir: Path) -> None:
    spec = spec_for(sock_dir, replicas=3)
    seen: list[tuple[str, bool]] = []
    manager = manager_for([spec], on_readiness=lambda r, ok: seen.append((r, ok)))
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        first = daemon_pid(spec)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await wait_until(manager, lambda: (spec.resource, False) in seen[2:], 5)
        await wait_until(manager, lambda: manager.ready(spec.resource), 5)
        second = daemon_pid(spec)
        assert second is not None
        assert second != first
        control = probe(spec)
        assert await control.send("get_default_device_pinned_mem_limit 0") == "14G"
        sent = read(Path(spec.log_dir) / "control.log")
        assert "set_default_device_pinned_mem_limit 0 15356M" in sent
        assert await control.send("get_default_active_thread_percentage") == "33.0"
        assert exists(spec.ready_marker)
    assert seen == [(spec.resource, s) for s in (False, True, False, True, False)]


async def test_hung_daemon_is_killed_and_replaced(sock_dir: Path) -> None:
    spec = spec_for(sock_dir)
    manager = manager_for([spec], timeout_s=1.0)
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        hung = daemon_pid(spec)
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        await wait_until(manager, lambda: not manager.ready(spec.resource), 10)
        assert not exists(spec.ready_marker)
        assert not exists(spec.started_marker)
        await wait_until(manager, lambda: manager.ready(spec.resource), 15)
        assert not process_alive(hung)
        assert await probe(spec).send("get_default_device_pinned_mem_limit 0") == "4G"
        sent = read(Path(spec.log_dir) / "control.log")
        assert "set_default_device_pinned_mem_limit 0 4606M" in sent


async def test_compute_mode_set_and_reset(sock_dir: Path) -> None:
    calls = sock_dir / "smi.log"
    spec = spec_for(sock_dir)
    manager = manager_for([spec], compute_mode=fake_smi(calls, "ok"))
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        uuid = spec.gpu_uuids[0]
        assert read(calls).splitlines() == [f"-i {uuid} -c EXCLUSIVE_PROCESS"]
    assert read(calls).splitlines() == [
        f"-i {uuid} -c EXCLUSIVE_PROCESS",
        f"-i {uuid} -c DEFAULT",
    ]
    assert manager.problems == ()


async def test_compute_mode_failure_is_reported_and_daemon_still_runs(sock_dir: Path) -> None:
    calls = sock_dir / "smi.log"
    spec = spec_for(sock_dir)
    manager = manager_for([spec], compute_mode=fake_smi(calls, "fail"))
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        assert manager.problems == (
            f"could not set compute mode of {spec.gpu_uuids[0]} to EXCLUSIVE_PROCESS: "
            "Insufficient Permissions; MPS works without it but another non-MPS process "
            "could then use the GPU",
        )
        assert await probe(spec).send("get_default_active_thread_percentage") == "10.0"
    # Never set, so never reset: only the failed attempt was made.
    assert read(calls).splitlines() == [f"-i {spec.gpu_uuids[0]} -c EXCLUSIVE_PROCESS"]


class _Warnings(logging.Handler):
    """Collects the manager's warnings and wakes the test after `wanted` of them."""

    def __init__(self, wanted: int) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.enough = asyncio.Event()
        self._wanted = wanted

    def emit(self, record: logging.LogRecord) -> None:
        # a structured event (`gpuslice.logs`): the problem is its `message` field
        fields = getattr(record, STRUCTURED_ATTR)
        assert fields["event"] == "mps-problem", fields
        self.messages.append(fields["message"])
        if len(self.messages) >= self._wanted:
            self.enough.set()


async def test_failed_start_is_reported_retried_and_stops_cleanly(sock_dir: Path) -> None:
    spec = spec_for(sock_dir)
    missing = (str(sock_dir / "no-such-mps-control"),)
    warnings = _Warnings(wanted=2)
    logger = logging.getLogger(f"test.mps.{id(warnings)}")
    logger.propagate = False
    logger.addHandler(warnings)
    manager = MpsDaemonManager([spec], ControlProgram.factory(missing), timings=FAST, logger=logger)
    try:
        async with running(manager):
            await asyncio.wait_for(warnings.enough.wait(), 10)
            assert not manager.ready(spec.resource)
            assert not exists(spec.ready_marker)
    finally:
        logger.removeHandler(warnings)
    first = warnings.messages[0]
    assert first.startswith(f"MPS daemon for {spec.resource} failed to start: ")
    assert "no-such-mps-control -d" in first
    assert first.endswith("retrying in 0.5 s")
    assert manager.problems[:2] == tuple(warnings.messages[:2])


async def test_reconfigure_restarts_changed_starts_new_and_stops_removed(sock_dir: Path) -> None:
    a10 = spec_for(sock_dir, replicas=10, name="nvidia.com/gpu", index=0)
    a5 = spec_for(sock_dir, replicas=5, name="nvidia.com/gpu", index=0)
    b = spec_for(sock_dir, replicas=4, name="nvidia.com/gpu.shared", index=1)
    manager = manager_for([a10])
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(a10.resource), 10)
        old_a = daemon_pid(a10)

        await manager.reconfigure([a5, b])
        await wait_until(
            manager, lambda: manager.ready(a5.resource) and manager.ready(b.resource), 10
        )
        new_a, pid_b = daemon_pid(a5), daemon_pid(b)
        assert old_a is not None
        assert not process_alive(old_a)
        assert new_a not in (None, old_a)
        assert await probe(a5).send("get_default_device_pinned_mem_limit 0") == "8G"
        sent = read(Path(a5.log_dir) / "control.log")
        assert "set_default_device_pinned_mem_limit 0 9213M" in sent
        assert await probe(a5).send("get_default_active_thread_percentage") == "20.0"
        assert await probe(b).send("get_default_device_pinned_mem_limit 1") == "11G"
        sent = read(Path(b.log_dir) / "control.log")
        assert "set_default_device_pinned_mem_limit 1 11517M" in sent
        assert exists(a5.ready_marker)

        await manager.reconfigure([b])
        assert not manager.ready(a5.resource)
        assert new_a is not None
        assert not process_alive(new_a)
        assert not exists(a5.started_marker)
        assert daemon_pid(b) == pid_b  # unchanged spec: left running
        assert manager.ready(b.resource)
        assert exists(b.ready_marker)

        await manager.reconfigure([])
        assert not manager.ready(b.resource)
        assert not exists(b.ready_marker)
        assert pid_b is not None
        assert not process_alive(pid_b)


async def test_reconfigure_before_run_only_replaces_the_specs(sock_dir: Path) -> None:
    a = spec_for(sock_dir)
    manager = manager_for([])
    await manager.reconfigure([a])
    assert manager.specs == (a,)
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(a.resource), 10)


async def test_cancelled_run_still_quits_its_daemons(sock_dir: Path) -> None:
    spec = spec_for(sock_dir)
    manager = manager_for([spec])
    task = asyncio.create_task(manager.run(asyncio.Event()))
    await wait_until(manager, lambda: manager.ready(spec.resource), 10)
    pid = daemon_pid(spec)
    assert pid is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not process_alive(pid)
    assert not exists(spec.started_marker)
    assert not exists(spec.ready_marker)


async def test_keep_running_leaves_daemons_to_the_next_agent_which_takes_them_over(
    sock_dir: Path,
) -> None:
    """DRA mode: a claim's pods outlive an agent restart, so does its daemon."""
    spec = spec_for(sock_dir)
    first = manager_for([spec], keep_running=True)
    async with running(first):
        await wait_until(first, lambda: first.ready(spec.resource), 10)
        pid = daemon_pid(spec)
    assert pid is not None
    assert process_alive(pid)  # left running for the next agent
    assert await probe(spec).send("get_default_active_thread_percentage") == "10.0"
    second = manager_for([spec], keep_running=True)
    async with running(second):
        await wait_until(second, lambda: second.ready(spec.resource), 10)
        assert daemon_pid(spec) == pid  # taken over, not restarted
        log = read(Path(spec.log_dir) / "control.log")
        assert "Command: quit" not in log
        await second.reconfigure([])  # its claims went: now it is stopped
        # taken over, so only asked to quit (its identity is not pinned): it exits shortly
        for _ in range(100):
            if not process_alive(pid):
                break
            await asyncio.sleep(0.05)
        assert not process_alive(pid)
    assert "Command: quit" in read(Path(spec.log_dir) / "control.log")


async def test_keep_running_leaves_daemons_when_the_run_is_cancelled(sock_dir: Path) -> None:
    """An agent whose loops end in an error (its task group cancels the manager) leaves the
    daemon to the next agent, as a stopped one does: its clients are in pods that go on."""
    spec = spec_for(sock_dir)
    manager = manager_for([spec], keep_running=True)
    task = asyncio.create_task(manager.run(asyncio.Event()))
    await wait_until(manager, lambda: manager.ready(spec.resource), 10)
    pid = daemon_pid(spec)
    assert pid is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_alive(pid)
    assert "Command: quit" not in read(Path(spec.log_dir) / "control.log")
    await probe(spec).send("quit")  # the test's cleanup: no agent follows


async def test_a_setting_the_daemon_ignored_keeps_the_resource_unready(sock_dir: Path) -> None:
    """The real control program exits 0 when the daemon refuses a thread percentage (it
    keeps the old one and prints it: seen on driver 580), so only the read-back tells. A
    daemon without its share must not serve pods as if it had one."""
    spec = dataclasses.replace(spec_for(sock_dir), active_thread_percentage=0)
    manager = manager_for([spec])

    def refused() -> bool:
        return any("did not take its settings" in p for p in manager.problems)

    async with running(manager):
        for _ in range(200):  # the first start's read-back fails within a second here
            if refused():
                break
            await asyncio.sleep(0.05)
        assert refused(), manager.problems
        assert not manager.ready(spec.resource)
        assert not exists(spec.started_marker)
    assert any(
        "`get_default_active_thread_percentage` answered '100.0', expected '0.0'" in p
        for p in manager.problems
    )


def _dra_claim_spec(root: Path) -> MpsDaemonSpec:
    """A DRA claim's daemon as Prepare starts it (25 % of the SMs, 11517 MiB on GPU 0)."""
    return claim_daemon_spec(
        "shares-0123456789ab", str(root), [(gpu(0).uuid, 0)],
        thread_percentage=25, limits_mib={0: 11517},
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
async def test_settings_a_client_changes_are_read_back_and_sent_again(
    sock_dir: Path, mode: str
) -> None:
    """Every client container has the pipe directory, so any client can lift the limits
    for every MPS server started after it; the health round reads them back and repairs
    them, and says so."""
    spec = spec_for(sock_dir) if mode == "device-plugin" else _dra_claim_spec(sock_dir)
    manager = manager_for([spec])
    index, mib = spec.pinned_mem_limits_mib[0]
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        client = probe(spec)
        await client.send("set_default_active_thread_percentage 100")
        await client.send(f"set_default_device_pinned_mem_limit {index} 40000M")
        told = ""

        def repaired() -> bool:
            nonlocal told
            told = " ".join(p for p in manager.problems if "changed behind the agent" in p)
            return "'100.0'" in told and "'39G'" in told

        await eventually(repaired, "both settings read back changed and sent again")
        assert await client.send("get_default_active_thread_percentage") == (
            f"{float(spec.active_thread_percentage):.1f}"
        )
        assert await client.send(f"get_default_device_pinned_mem_limit {index}") == (
            pinned_limit_shown(mib)
        )
        assert manager.ready(spec.resource)
    assert "`get_default_active_thread_percentage` answered '100.0'" in told
    assert f"`get_default_device_pinned_mem_limit {index}` answered '39G'" in told
