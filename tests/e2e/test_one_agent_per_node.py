"""Two device-plugin agents on one node (a force-deleted pod whose process lingers, two
releases with overlapping node selectors): the second waits for the node's lock, touches no
socket and registers nothing while the first lives, and takes over once the first is
SIGKILLed; an agent stopped while it waits exits 0."""

from __future__ import annotations

from pathlib import Path

from daemon_fixtures import running_daemon

from gpuslice.kubelet.sockets import socket_identity
from gpuslice.testing.daemon import DaemonProcess

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
