"""Client strings over real gRPC: bounded and escaped in errors and logs, never echoed whole."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from gpuslice.kubelet.convert import allocate_request, preferred_request
from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from tests.kubelet.kubelet_plans import gpu, inventory, plan, running_node, shared

GPUS = [gpu(i) for i in range(2)]
INV = inventory(GPUS)
HUGE = "GPU-" + "x" * 1_000_000
FORGED = "GPU-a\nevent=allocated resource=nvidia.com/gpu,devices=GPU-0 x=y"


async def test_must_include_outside_available_is_refused_by_name(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV, register=False) as node:
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(socket.is_socket, 10)
        g0 = [f"{GPUS[0].uuid}::{n}" for n in range(4)]
        g1 = [f"{GPUS[1].uuid}::{n}" for n in range(4)]
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            # the case: four must_include IDs, none available, size 2
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.get_preferred_allocation(preferred_request(g1, g0, 2), timeout_s=5)
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            details = err.value.details() or ""
            assert "must_include device(s) not in available" in details
            assert g0[0] in details
            # a partial overlap names only the missing one
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.get_preferred_allocation(
                    preferred_request(g1, [g1[0], g0[2]], 2), timeout_s=5
                )
            details = err.value.details() or ""
            assert g0[2] in details
            assert g1[0] not in details
            # still serving, and every ID answered is an available one
            ok = await client.get_preferred_allocation(
                preferred_request(g1, [g1[2]], 2), timeout_s=5
            )
            (chosen,) = ok.container_responses
            assert chosen.deviceIDs[0] == g1[2]
            assert set(chosen.deviceIDs) <= set(g1)
            assert len(chosen.deviceIDs) == 2


async def test_huge_and_forged_ids_are_bounded_and_escaped(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV, register=False) as node:
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(socket.is_socket, 10)
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            for call in (
                client.allocate(allocate_request([HUGE]), timeout_s=10),
                client.get_preferred_allocation(preferred_request([HUGE], [], 1), timeout_s=10),
                client.allocate(allocate_request([FORGED]), timeout_s=10),
                client.get_preferred_allocation(
                    preferred_request([FORGED, *[f"bad-{n}" for n in range(100)]], [], 1),
                    timeout_s=10,
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.UNKNOWN  # refused, not a transport error
                details = err.value.details() or ""
                assert len(details) < 2_000
                assert "\n" not in details
                assert "x=y" not in details
            # the server is still there
            response = await client.allocate(allocate_request([f"{GPUS[1].uuid}::0"]), timeout_s=5)
            assert len(response.container_responses) == 1
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "x" * 1_000 not in text
    assert not any("\n" in r.getMessage() for r in caplog.records)
    assert " x=y" not in text  # the forged field never appears raw
    assert "and 93 more" in text  # 101 unknown IDs: eight shown, the rest counted
