"""Claims isolated, through the `gpuslice plugin --dra` process: a claim whose MPS daemon
hangs at its start does not hold another claim's Prepare; a Prepare cancelled by the
caller's deadline leaves no MPS daemon, CDI spec, MPS directory or record of its claim, and
its retry succeeds; claim names that would become paths are refused and create nothing.

The hang is the fake MPS control program's hold directory (`GPUSLICE_FAKE_MPS_HOLD_DIR`,
passed to the daemon, which passes it to the programs it runs). Waits are bounded waits on
conditions; nothing here measures time (`bench/faults_claims.py` does).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import grpc
import pytest

from gpuslice.core.dra.claims import claim_daemon_key
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.jsontypes import Json
from gpuslice.dra.convert import claims_to_v1
from gpuslice.dra.rpc import DraClientV1, unix_target
from gpuslice.emulator.fake_mps_control import HOLD_ENV
from gpuslice.mps.control import process_alive
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import DRIVER, DraNode, claim_obj, opaque, request, running_dra_node

MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
       "sharing": {"strategy": "MPS"}}  # fmt: skip
TWO_GPUS = "sim:2xh100-80gb"
CLEANUP_S = 30.0
"""Bound on the undo of a hung daemon: its quit grace period, then SIGKILL."""


def _hold_dir(workdir: Path) -> Path:
    path = workdir / "hold"
    path.mkdir()
    return path


def _daemon_dir(node: DraNode, ref: ClaimRef, device: str) -> Path:
    gpu_uuid = node.devices()[device]["attributes"]["uuid"]["string"]
    return node.plugin_dir / "mps" / claim_daemon_key(ref.uid, [gpu_uuid])


def _pid_file(daemon_dir: Path) -> Path:
    return daemon_dir / "pipe" / "nvidia-cuda-mps-control.pid"


def _recorded(node: DraNode) -> Json:
    doc = json.loads((node.plugin_dir / "gpuslice-checkpoint.json").read_text("utf-8"))
    claims: Json = doc["data"]["claims"]
    return claims


def _cdi_specs(node: DraNode) -> list[str]:
    return sorted(p.name for p in node.cdi_root.glob("*")) if node.cdi_root.exists() else []


async def test_a_hung_mps_start_does_not_hold_another_claims_prepare(
    sock_dir: Path, api: FakeApiServer
) -> None:
    hold_dir = _hold_dir(sock_dir)
    async with running_dra_node(
        sock_dir, api, node=TWO_GPUS, env={HOLD_ENV: str(hold_dir)}
    ) as node:
        slow = node.allocate(
            claim_obj("slow", [request("gpu")], [opaque(MPS)]), devices={"gpu": "gpu-0"}
        )
        fast = node.allocate(claim_obj("fast", [request("gpu")]), devices={"gpu": "gpu-1"})
        daemon_dir = _daemon_dir(node, slow, "gpu-0")
        hold = hold_dir / daemon_dir.name
        hold.touch()
        pending = asyncio.create_task(node.prepare(slow))
        await node.wait(_pid_file(daemon_dir).exists, "the slow claim's daemon started (held)")
        got = await node.prepare(fast)
        assert got[fast.uid].error == ""
        assert not pending.done()  # answered while the slow claim still waits on its daemon
        assert _recorded(node)[slow.uid]["state"] == "PrepareStarted"
        hold.unlink()
        assert (await pending)[slow.uid].error == ""
        assert await node.unprepare(slow, fast) == {slow.uid: "", fast.uid: ""}
        await node.wait(lambda: not daemon_dir.exists(), "the daemon's directory removed")
        assert _cdi_specs(node) == []


async def test_a_prepare_cancelled_by_its_deadline_leaves_nothing_and_the_retry_succeeds(
    sock_dir: Path, api: FakeApiServer
) -> None:
    hold_dir = _hold_dir(sock_dir)
    async with running_dra_node(sock_dir, api, env={HOLD_ENV: str(hold_dir)}) as node:
        claim = claim_obj("cut", [request("gpu")], [opaque(MPS)])
        ref = node.allocate(claim, devices={"gpu": "gpu-0"})
        daemon_dir = _daemon_dir(node, ref, "gpu-0")
        hold = hold_dir / daemon_dir.name
        hold.touch()
        registration = node.kubelet.registration(DRIVER)
        assert registration is not None
        async with grpc.aio.insecure_channel(unix_target(registration.endpoint)) as channel:
            # the kubelet's own deadline (45 s) cancels a call the same way, only later
            call = asyncio.create_task(
                DraClientV1(channel).prepare(
                    v1.NodePrepareResourcesRequest(claims=claims_to_v1([ref])), timeout_s=4.0
                )
            )
            await node.wait(
                lambda: _pid_file(daemon_dir).exists() or call.done(), "the held daemon started"
            )
            pid = int(_pid_file(daemon_dir).read_text()) if _pid_file(daemon_dir).exists() else 0
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call
        assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await node.wait(lambda: "dra-prepare-undone" in node.log(), "the undo", CLEANUP_S)
        assert "dra-prepare-cancelled" in node.log()  # cancelled, not failed by a deadline
        assert pid == 0 or not process_alive(pid)
        assert not daemon_dir.exists()
        assert _cdi_specs(node) == []
        assert _recorded(node) == {}
        hold.unlink()
        retried = (await node.prepare(ref))[ref.uid]
        assert retried.error == ""
        assert _pid_file(daemon_dir).exists()
        assert _recorded(node)[ref.uid]["state"] == "PrepareCompleted"
        assert await node.unprepare(ref) == {ref.uid: ""}
        await node.wait(lambda: not daemon_dir.exists(), "the retried claim's daemon stopped")


async def test_path_hostile_claim_names_are_refused_and_create_nothing(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api) as node:
        hostile = [
            (ClaimRef("default", "../../../../tmp/evil", "c"), "claim.uid '../../../../tmp/evil'"),
            (ClaimRef("default", "a/b", "c"), "claim.uid 'a/b'"),
            (ClaimRef("default", "..", "c"), "claim.uid '..'"),
            (ClaimRef("../kube-system", str(uuid.uuid4()), "c"), "claim.namespace '../kube"),
            (ClaimRef("default", str(uuid.uuid4()), "../../c"), "claim.name '../../c'"),
        ]
        refs = [ref for ref, _ in hostile]
        requests_before = len(api.requests)
        mps_before = sorted((node.plugin_dir / "mps").rglob("*"))
        prepared = await node.prepare(*refs)
        unprepared = await node.unprepare(*refs)
        for ref, named in hostile:
            assert prepared[ref.uid].error.startswith(f"refused: {named}"), prepared[ref.uid]
            assert prepared[ref.uid].devices == ()
            assert unprepared[ref.uid].startswith(f"refused: {named}")
        reads = [r for r in api.requests[requests_before:] if "resourceclaims" in r.path]
        assert reads == []  # none of them was looked up in the API
        assert sorted((node.plugin_dir / "mps").rglob("*")) == mps_before
        assert _cdi_specs(node) == []
        assert _recorded(node) == {}
        assert not (sock_dir / "tmp").exists()
        # the daemon serves on: a good claim in the same batch as a hostile one prepares
        good = node.allocate(claim_obj("good", [request("gpu")]), devices={"gpu": "gpu-0"})
        both = await node.prepare(good, refs[0])
        assert both[good.uid].error == ""
        assert both[refs[0].uid].error.startswith("refused: claim.uid")
        assert node.daemon.running
