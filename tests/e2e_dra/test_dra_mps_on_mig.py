"""MPS on a MIG device through `gpuslice plugin --dra` and the emulated kubelet, with the
fake control program: NVIDIA's `MigDeviceConfig` with MPS (and `multiUser`) is prepared,
its daemon serves that MIG device alone, outlives an agent restart (taken over, not
restarted) and stops at Unprepare."""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.core.jsontypes import Json
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import DRIVER, DraNode, claim_obj, opaque, request, running_dra_node

NVIDIA = "resource.nvidia.com/v1beta1"
MIG_NODE = "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2"
DEVICE = "gpu-0-mig-2g10gb-14-2"


def _edits(node: DraNode, claim_uid: str, device: str) -> Json:
    spec = node.cdi_spec(claim_uid)
    entry = next(d for d in spec["devices"] if d["name"].endswith(f"-{device}"))
    edits: Json = entry["containerEdits"]
    return edits


def _uuid(node: DraNode, device: str) -> str:
    return str(node.devices()[device]["attributes"]["uuid"]["string"])


def _pid(pipe: Path) -> int:
    return int((pipe / "nvidia-cuda-mps-control.pid").read_text().strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _is_dir(path: Path) -> bool:
    return path.is_dir()


def _control_log(pipe: Path) -> str:
    return (pipe.parent / "log" / "control.log").read_text(errors="replace")


async def test_mps_on_a_mig_device_runs_a_daemon_for_it_that_outlives_a_restart(
    sock_dir: Path, api: FakeApiServer
) -> None:
    params = {
        "apiVersion": NVIDIA,
        "kind": "MigDeviceConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "4Gi",
                "multiUser": True,
            },
        },
    }
    async with running_dra_node(sock_dir, api, node=MIG_NODE) as node:
        claim = claim_obj("mig-mps", [request("mig", "mig.nvidia.com")], [opaque(params)])
        ref = node.allocate(claim, devices={"mig": DEVICE})
        first = (await node.prepare(ref))[ref.uid]
        assert first.error == "", first.error
        mig_uuid = _uuid(node, DEVICE)
        edits = _edits(node, ref.uid, DEVICE)
        env = dict(e.split("=", 1) for e in edits["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        pipe = Path(mounts["/tmp/nvidia-mps"])
        assert pipe.parent.name.startswith(f"{ref.uid}-")
        assert _is_dir(Path(mounts["/dev/shm"]))
        # the daemon: started multi-user, seeing only the MIG device, limit on its device 0
        log = _control_log(pipe)
        assert f"Started multi-user=yes CUDA_VISIBLE_DEVICES={mig_uuid}\n" in log
        assert "set_default_device_pinned_mem_limit 0 4096M" in log
        assert "set_default_active_thread_percentage 50" in log
        pid = _pid(pipe)
        # an agent restart (an upgrade): the daemon is taken over, not restarted
        await node.restart_daemon()
        await node.kubelet.wait_registered(DRIVER, 30.0)
        assert (await node.prepare(ref))[ref.uid] == first
        await node.wait(lambda: "event=mps-daemon-taken-over" in node.log(), "take-over")
        assert _pid(pipe) == pid
        assert _alive(pid)
        assert _control_log(pipe).count(" Started ") == 1
        assert "Command: quit" not in _control_log(pipe)
        # Unprepare stops it and removes its directory
        assert await node.unprepare(ref) == {ref.uid: ""}
        await node.wait(lambda: not _alive(pid), "the MIG device's daemon stopped")
        await node.wait(lambda: not pipe.parent.exists(), "its directory removed")


async def test_mps_on_two_mig_devices_of_one_claim_and_a_plain_one_beside_it(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """NVIDIA's grouping: one config, one daemon for all its MIG devices; a MIG device of
    the same GPU held by another claim without MPS is untouched (no compute mode change:
    the e2e node runs `--no-compute-mode`, the manager's test covers that)."""
    params = {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    async with running_dra_node(sock_dir, api, node=MIG_NODE) as node:
        two = ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1"]
        claim = claim_obj(
            "two", [request("a", "mig.nvidia.com"), request("b", "mig.nvidia.com")],
            [opaque(params)],
        )  # fmt: skip
        ref = node.allocate(claim, devices={"a": two[0], "b": two[1]})
        plain = node.allocate(
            claim_obj("plain", [request("m", "mig.nvidia.com")]), devices={"m": DEVICE}
        )
        results = await node.prepare(ref, plain)
        assert (results[ref.uid].error, results[plain.uid].error) == ("", "")
        pipes = {
            next(m["hostPath"] for m in _edits(node, ref.uid, d)["mounts"]
                 if m["containerPath"] == "/tmp/nvidia-mps")
            for d in two
        }  # fmt: skip
        assert len(pipes) == 1
        pipe = Path(pipes.pop())
        visible = ",".join(sorted(_uuid(node, d) for d in two))
        assert f"Started multi-user=no CUDA_VISIBLE_DEVICES={visible}\n" in _control_log(pipe)
        plain_edits = _edits(node, plain.uid, DEVICE)
        assert not any("nvidia-mps" in m["containerPath"] for m in plain_edits["mounts"])
        assert not any(e.startswith("CUDA_MPS_") for e in plain_edits["env"])
        pid = _pid(pipe)
        assert await node.unprepare(ref, plain) == {ref.uid: "", plain.uid: ""}
        await node.wait(lambda: not _alive(pid), "the claim's daemon stopped")
