"""The agent killed inside an MPS claim's Prepare, after the GPU was set to
EXCLUSIVE_PROCESS and before the claim's daemon answered: the next agent undoes the
unfinished Prepare from its record, the compute mode included, so later whole-GPU claims
with more than one CUDA process still run there.

The daemon is held at its start by the fake control program's hold directory; the
`nvidia-smi` the agent runs records its calls (`tests.e2e_dra.dra_node.fake_nvidia_smi`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from gpuslice.core.dra.claims import claim_daemon_key
from gpuslice.emulator.dra_kubelet import DraKubeletError
from gpuslice.emulator.fake_mps_control import HOLD_ENV
from gpuslice.mps.control import process_alive
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.eventually import eventually_async
from tests.e2e_dra.dra_node import claim_obj, opaque, request, running_dra_node

MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
       "sharing": {"strategy": "MPS"}}  # fmt: skip


def pid_in(daemon_dir: Path) -> int:
    path = daemon_dir / "pipe" / "nvidia-cuda-mps-control.pid"
    return int(path.read_text().strip()) if path.exists() else 0


async def test_a_crash_between_exclusive_process_and_the_daemon_is_undone_at_the_next_start(
    sock_dir: Path, api: FakeApiServer
) -> None:
    hold_dir = sock_dir / "hold"
    hold_dir.mkdir()
    async with running_dra_node(
        sock_dir, api, env={HOLD_ENV: str(hold_dir)}, compute_mode=True
    ) as node:
        ref = node.allocate(
            claim_obj("mps", [request("gpu")], [opaque(MPS)]), devices={"gpu": "gpu-0"}
        )
        gpu = node.devices()["gpu-0"]["attributes"]["uuid"]["string"]
        exclusive, default = f"-i {gpu} -c EXCLUSIVE_PROCESS", f"-i {gpu} -c DEFAULT"
        daemon_dir = node.plugin_dir / "mps" / claim_daemon_key(ref.uid, [gpu])
        hold = hold_dir / daemon_dir.name
        hold.touch()
        pending = asyncio.create_task(node.prepare(ref))
        await node.wait(lambda: pid_in(daemon_dir) != 0, "the claim's daemon started (held)")
        assert exclusive in node.nvidia_smi_calls()
        assert node.daemon.proc is not None
        node.daemon.proc.send_signal(signal.SIGKILL)  # the crash
        await node.daemon.proc.wait()
        with contextlib.suppress(DraKubeletError):
            await pending
        held = pid_in(daemon_dir)
        hold.unlink()  # the daemon answers now: a stray no agent supervises
        assert node.nvidia_smi_calls()[-1] == exclusive

        await node.daemon.start()
        await node.wait(lambda: node.log().count("dra-checkpoint-loaded") == 2, "restarted")
        assert "dra-prepare-unfinished" in node.log()
        assert node.nvidia_smi_calls()[-1] == default, "the compute mode is undone"
        await node.wait(lambda: not process_alive(held), "the stray daemon quit")

        # the kubelet's retry (once its connection is back) prepares the claim as new, and
        # its Unprepare undoes it all
        errors: list[str] = []

        async def prepared() -> bool:
            try:
                errors.append((await node.prepare(ref))[ref.uid].error)
            except DraKubeletError as exc:  # the kubelet's channel to the dead agent
                errors.append(str(exc))
                return False
            return True

        await eventually_async(prepared, "the kubelet's retry answered", timeout=30.0)
        assert errors[-1] == ""
        assert node.nvidia_smi_calls()[-1] == exclusive
        assert await node.unprepare(ref) == {ref.uid: ""}
        assert node.nvidia_smi_calls()[-1] == default
