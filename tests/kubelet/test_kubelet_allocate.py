"""Allocate and GetPreferredAllocation over the wire, through the emulated kubelet."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from gpuslice.core.allocation.response import Mount
from gpuslice.core.sharing.model import AllocateSettings
from gpuslice.emulator.kubelet import AdmissionError, KubeletEmulator
from gpuslice.kubelet.convert import allocate_request, preferred_request
from gpuslice.kubelet.manager import DevicePluginManager
from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.ports import ContainerDevices
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.state import PlanState
from tests.kubelet.kubelet_plans import gpu, inventory, plan, running_node, shared, whole

GPUS = [gpu(0), gpu(1)]
INV = inventory(GPUS)
GPU = "nvidia.com/gpu"


def gpu_of(device_id: str) -> str:
    return device_id.split("::", 1)[0]


async def test_admitted_pod_gets_the_physical_gpu_in_its_env(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 8, 10)
        admission = await k.admit("default", "p1", [("main", {GPU: 1})])
        (container,) = admission.containers
        (device_id,) = container.device_ids
        assert device_id.startswith(gpu_of(device_id) + "::")
        assert container.envs == {"NVIDIA_VISIBLE_DEVICES": gpu_of(device_id)}
        assert k.free(GPU) == tuple(i for i in k.devices(GPU) if i != device_id)
        assert k.assignments() == (ContainerDevices("default", "p1", "main", GPU, (device_id,)),)
        assert await k.list_assignments() == k.assignments()
        await k.delete_pod("default", "p1")
        assert k.assignments() == ()
        assert len(k.free(GPU)) == 8


async def test_volume_mounts_and_cdi_travel_through_the_wire(sock_dir: Path) -> None:
    settings = AllocateSettings(device_list_strategies=("volume-mounts", "cdi-cri"))
    async with running_node(sock_dir, plan(whole(GPUS), allocate=settings), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 2, 10)
        admission = await k.admit("ns", "p", [("a", {GPU: 1}), ("b", {GPU: 1})])
    a, b = admission.containers
    assert {a.device_ids[0], b.device_ids[0]} == {g.uuid for g in GPUS}
    for c in (a, b):
        (uuid,) = c.device_ids
        assert c.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
        assert c.mounts == (Mount("/var/run/nvidia-container-devices/" + uuid, "/dev/null", False),)
        assert c.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={uuid}",)


@pytest.mark.parametrize(("policy", "distinct_gpus"), [("distributed", 2), ("packed", 1)])
async def test_preferred_allocation_spreads_or_packs(
    sock_dir: Path, policy: str, distinct_gpus: int
) -> None:
    settings = AllocateSettings(allocation_policy=policy)  # type: ignore[arg-type]
    async with running_node(sock_dir, plan(shared(GPUS, 4), allocate=settings), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 8, 10)
        first = await k.admit("default", "p1", [("c", {GPU: 1})])
        second = await k.admit("default", "p2", [("c", {GPU: 1})])
    used = {gpu_of(first.containers[0].device_ids[0]), gpu_of(second.containers[0].device_ids[0])}
    assert len(used) == distinct_gpus


async def test_shared_request_for_two_fails_with_the_kubelets_text(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 8, 10)
        with pytest.raises(AdmissionError) as err:
            await k.admit("default", "greedy", [("c", {GPU: 2})])
        text = str(err.value)
        assert text.startswith(
            "Allocate failed due to rpc error: code = Unknown desc = invalid allocation request"
            ' for "nvidia.com/gpu": invalid request: maximum request size for shared resources'
            " is 1; found 2"
        )
        assert text.endswith(", which is unexpected")
        assert k.assignments() == ()
        # The plugin is still serving: a valid request goes through.
        ok = await k.admit("default", "modest", [("c", {GPU: 1})])
        assert len(ok.containers[0].device_ids) == 1


async def test_not_enough_free_devices(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(whole(GPUS)), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 2, 10)
        await k.admit("default", "p1", [("c", {GPU: 2})])
        with pytest.raises(AdmissionError) as err:
            await k.admit("default", "p2", [("c", {GPU: 1})])
        assert str(err.value) == (
            "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu."
            " Requested: 1, Available: 0, which is unexpected"
        )
        await k.delete_pod("default", "p1")
        await k.admit("default", "p2", [("c", {GPU: 1})])


async def test_unhealthy_devices_are_not_handed_out(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 2)), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 4, 10)
        node.state.publish(unhealthy=frozenset({GPUS[0].uuid}))
        await k.wait_for(lambda: k.allocatable(GPU) == 2, 10)
        for pod in ("a", "b"):
            admitted = await k.admit("default", pod, [("c", {GPU: 1})])
            assert gpu_of(admitted.containers[0].device_ids[0]) == GPUS[1].uuid
        with pytest.raises(AdmissionError, match="Available: 0"):
            await k.admit("default", "c", [("c", {GPU: 1})])


async def test_unknown_device_is_refused_and_server_keeps_serving(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(whole(GPUS)), INV, register=False) as node:
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(socket.is_socket, 10)
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.allocate(allocate_request(["GPU-nope"]), timeout_s=5)
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert err.value.details() == (
                'invalid allocation request for "nvidia.com/gpu": invalid request: '
                "unknown device: GPU-nope"
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.get_preferred_allocation(
                    preferred_request(["GPU-nope"], [], 1), timeout_s=5
                )
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert "GPU-nope" in (err.value.details() or "")
            response = await client.allocate(allocate_request([GPUS[1].uuid]), timeout_s=5)
            (container,) = response.container_responses
            assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid}
            empty = await client.pre_start_container(
                api.PreStartContainerRequest(devices_ids=[GPUS[1].uuid]), timeout_s=5
            )
            assert empty == api.PreStartContainerResponse()


async def test_preferred_allocation_round_trip(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV, register=False) as node:
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(socket.is_socket, 10)
        g0 = [f"{GPUS[0].uuid}::{n}" for n in range(4)]
        g1 = [f"{GPUS[1].uuid}::{n}" for n in range(4)]
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            # GPU 0 has three replicas taken already, GPU 1 none: prefer GPU 1.
            response = await client.get_preferred_allocation(
                preferred_request([g0[3], *g1], [], 2), timeout_s=5
            )
            (chosen,) = response.container_responses
            assert [gpu_of(i) for i in chosen.deviceIDs] == [GPUS[1].uuid] * 2
            must = await client.get_preferred_allocation(
                preferred_request([g0[3], *g1], [g0[3]], 2), timeout_s=5
            )
            assert must.container_responses[0].deviceIDs[0] == g0[3]
            assert len(must.container_responses[0].deviceIDs) == 2


async def test_unexpected_failure_is_internal_and_server_keeps_serving(sock_dir: Path) -> None:
    calls = 0

    def flaky_probe() -> frozenset[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("stat /dev/nvidiactl: input/output error")
        return frozenset()

    state = PlanState(plan(whole(GPUS)), INV)
    kubelet = KubeletEmulator(sock_dir)
    await kubelet.start()
    manager = DevicePluginManager(
        state, plugin_dir=sock_dir, kubelet_socket=kubelet.socket_path, dev_nodes_probe=flaky_probe
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 2, 10)
        with pytest.raises(AdmissionError) as err:
            await kubelet.admit("default", "p1", [("c", {GPU: 1})])
        assert "code = Internal desc = internal error in gpuslice: OSError(" in str(err.value)
        admitted = await kubelet.admit("default", "p1", [("c", {GPU: 1})])
        assert len(admitted.containers[0].device_ids) == 1
    finally:
        stop.set()
        await task
        await kubelet.stop()
