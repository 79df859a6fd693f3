"""Two DRA agents on one node (a force-deleted pod whose process lingers, an overlapping
release): the second waits for the node's lock and leaves the sockets, the checkpoint and
the prepared claim's CDI spec alone while the first lives; once the first is SIGKILLed it
takes over and serves the first one's claims from the record."""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.aio.sockets import SocketId, socket_identity
from gpuslice.host.checkpoint_file import CHECKPOINT_NAME
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.daemon import DaemonProcess
from tests.e2e_dra.dra_node import DRIVER, claim_obj, request, running_dra_node


def _file_state(path: Path) -> tuple[int, bytes]:
    return os.stat(path).st_ino, path.read_bytes()


async def test_a_second_dra_agent_leaves_a_running_claim_alone_then_takes_over(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api) as node:
        first = node.daemon
        assert first.proc is not None
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        prepared = (await node.prepare(ref))[ref.uid]
        assert prepared.error == ""
        checkpoint = node.plugin_dir / CHECKPOINT_NAME
        cdi = node.cdi_root / f"k8s.gpuslice.io-claim_{ref.uid}.yaml"
        files = {p: _file_state(p) for p in (checkpoint, cdi)}
        registration = node.kubelet.registration(DRIVER)
        assert registration is not None
        sockets = [node.plugin_dir / "dra.sock", registration.registration_socket]
        served: dict[Path, SocketId | None] = {p: socket_identity(p) for p in sockets}

        second = DaemonProcess(first.args, log_path=sock_dir / "second.log", env=first.env)
        await second.start()
        try:
            # it says it waits, or (without the lock) it acts: either ends this wait
            await node.wait(
                lambda: (
                    "event=node-lock-busy" in second.log()
                    or any(socket_identity(p) != i for p, i in served.items())
                    or not second.running
                ),
                "the second agent to wait or to act",
            )
            assert {p: socket_identity(p) for p in sockets} == served, second.log()
            assert {p: _file_state(p) for p in files} == files, second.log()
            assert node.kubelet.registration(DRIVER) is registration
            assert second.running, second.log()
            assert f"pid={first.proc.pid} " in second.log()  # who holds the node
            assert "event=plan " not in second.log()

            first.proc.kill()
            await first.proc.wait()
            node.daemon = second  # node.wait now watches the one that must take over

            def took_over() -> bool:
                now = node.kubelet.registration(DRIVER)
                return now is not None and now is not registration

            await node.wait(took_over, "the second agent's registration")
            assert "event=node-lock-taken" in second.log()
            # the first agent's claim is the second's now: prepared as before, and undone
            assert (await node.prepare(ref))[ref.uid] == prepared
            assert await node.unprepare(ref) == {ref.uid: ""}
            assert not cdi.exists()

            # the killed agent's pod restarted: now it is the one that waits, and SIGTERM
            # ends its wait cleanly
            await first.start()
            await node.wait(
                lambda: "event=node-lock-busy" in first.log() or not first.running,
                "the restarted agent to wait",
            )
            assert await first.terminate() == 0, first.log()
        finally:
            code = await second.terminate()
        assert code == 0, second.log()
        assert "Traceback" not in second.log()
