"""Two device-plugin agents on one node (a force-deleted pod whose process lingers, two
releases with overlapping node selectors): the second waits for the node's lock, touches no
socket and registers nothing while the first lives, and takes over once the first is
SIGKILLed; an agent stopped while it waits exits 0."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

from gpuslice.aio.sockets import socket_identity
from gpuslice.host.nodelock import LOCK_NAME, NodeLock
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.metrics_support import wait_code

WAIT_S = 20.0
RESOURCE = "nvidia.com/gpu"
TS4 = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


async def test_a_second_agent_waits_for_the_node_then_takes_over_from_a_killed_one(
    sock_dir: Path,
) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        kubelet = node.kubelet
        first = node.daemon
        assert first.proc is not None
        await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 8, WAIT_S)
        socket = node.plugin_dir / "nvidia-gpu.sock"
        served = socket_identity(socket)
        registrations = kubelet.registrations[RESOURCE]
        second = DaemonProcess(first.args, log_path=sock_dir / "second.log", env=first.env)
        await second.start()
        try:
            # it says it waits, or (without the lock) it acts: either ends this wait
            await kubelet.wait_for(
                lambda: (
                    "event=node-lock-busy" in second.log()
                    or kubelet.registrations[RESOURCE] != registrations
                    or socket_identity(socket) != served
                    or not second.running
                ),
                WAIT_S,
            )
            assert kubelet.registrations[RESOURCE] == registrations, second.log()
            assert socket_identity(socket) == served, second.log()
            assert second.running, second.log()
            assert f"pid={first.proc.pid} " in second.log()  # who holds the node
            assert "event=plan " not in second.log()

            first.proc.kill()
            await first.proc.wait()
            await kubelet.wait_for(
                lambda: kubelet.registrations[RESOURCE] > registrations or not second.running,
                WAIT_S,
            )
            assert second.running, second.log()
            assert "event=node-lock-taken" in second.log()
            await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 8, WAIT_S)

            # the killed agent's pod restarted: now it is the one that waits, and SIGTERM
            # ends its wait cleanly
            await first.start()
            await kubelet.wait_for(
                lambda: "event=node-lock-busy" in first.log() or not first.running, WAIT_S
            )
            assert await first.terminate() == 0, first.log()
        finally:
            code = await second.terminate()
        assert code == 0, second.log()
        assert "Traceback" not in second.log()


HOLDER = "pid=4242 pod=gpuslice/old-agent node=n1 since=2026-01-01T00:00:00+00:00"


def _agent(sock_dir: Path, plugin_dir: Path, *extra: str) -> DaemonProcess:
    """A standalone agent (no kubelet socket): it is ready once it serves."""
    return DaemonProcess(
        [
            "--node", "sim:1xt4",
            "--device-plugin-path", str(plugin_dir),
            "--kubelet-socket", "",
            "--no-labels",
            "--no-compute-mode",
            *extra,
        ],
        log_path=sock_dir / "agent.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(sock_dir / "ctl")},
    )  # fmt: skip


def _held_by_another_process(plugin_dir: Path) -> NodeLock:
    """The lock as another agent holds it: this test's process, a different one from the
    agent's, so the kernel refuses the agent's flock exactly as it would a second pod's."""
    plugin_dir.mkdir(exist_ok=True)
    lock = NodeLock(plugin_dir / LOCK_NAME)
    assert lock.try_acquire(HOLDER)
    return lock


async def _get(url: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(fetch)


async def test_a_waiting_agent_is_alive_not_ready_and_names_the_holder(sock_dir: Path) -> None:
    plugin_dir = sock_dir / "dp"
    lock = _held_by_another_process(plugin_dir)
    port = free_port()
    agent = _agent(sock_dir, plugin_dir, "--health-port", str(port))
    await agent.start()
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_code(f"{base}/healthz", 200)  # the kubelet does not restart it
        code, body = await _get(f"{base}/readyz")
        assert code == 503
        assert "waiting for the node lock" in body
        assert "pod=gpuslice/old-agent" in body
        busy = [ln for ln in agent.log().splitlines() if "event=node-lock-busy" in ln]
        assert len(busy) == 1, agent.log()
        assert "pod=gpuslice/old-agent" in busy[0]
        assert not [p for p in plugin_dir.iterdir() if p.is_socket()]
        lock.release()  # the holder is gone
        await wait_code(f"{base}/readyz", 200)
        assert "event=node-lock-taken" in agent.log()
        assert [p.name for p in plugin_dir.iterdir() if p.is_socket()] == ["nvidia-gpu.sock"]
    finally:
        lock.release()
        assert await agent.terminate() == 0, agent.log()


async def test_a_bounded_wait_ends_in_one_error_line_naming_the_holder(sock_dir: Path) -> None:
    plugin_dir = sock_dir / "dp"
    lock = _held_by_another_process(plugin_dir)
    agent = _agent(sock_dir, plugin_dir, "--node-lock-wait", "0")
    try:
        await agent.start()
        code = await agent.wait_exit(WAIT_S)
    finally:
        lock.release()
        await agent.terminate()
    log = agent.log()
    assert code == 2, log
    assert "Traceback" not in log
    errors = [ln for ln in log.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, log
    assert str(plugin_dir / LOCK_NAME) in errors[0]
    assert HOLDER in errors[0]
    assert not [p for p in plugin_dir.iterdir() if p.is_socket()]


async def test_a_device_plugin_directory_it_cannot_use_is_one_error_line(sock_dir: Path) -> None:
    blocker = sock_dir / "a-file"
    blocker.write_text("not a directory\n", encoding="utf-8")
    agent = _agent(sock_dir, blocker / "dp")
    await agent.start()
    try:
        code = await agent.wait_exit(WAIT_S)
    finally:
        await agent.terminate()
    log = agent.log()
    assert code == 2, log
    assert "Traceback" not in log
    errors = [ln for ln in log.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, log
    assert str(blocker / "dp") in errors[0]
    assert "ENOTDIR" in errors[0]
