"""ListAndWatch: the initial list, updates on plan and health changes, and reconciling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.kubelet.servicer import ListingCache
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.state import PlanState
from tests.kubelet.kubelet_plans import gpu, inventory, plan, running_node, shared, whole

GPUS = [gpu(0, numa=0), gpu(1, numa=1), gpu(2)]
INV = inventory(GPUS)
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


async def next_list(stream: AsyncIterator[api.ListAndWatchResponse]) -> list[tuple[str, str]]:
    response = await asyncio.wait_for(anext(stream), 10)
    return [(d.ID, d.health) for d in response.devices]


async def test_initial_list_has_ids_health_and_numa_topology(sock_dir: Path) -> None:
    async with (
        running_node(sock_dir, plan(shared(GPUS, 2)), INV, register=False) as node,
    ):
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(socket.is_socket, 10)
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            stream = DevicePluginClient(channel).list_and_watch()
            first = await asyncio.wait_for(anext(stream), 10)
            await stream.aclose()
    got = [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices]
    assert got == [
        (f"{GPUS[0].uuid}::0", "Healthy", [0]),
        (f"{GPUS[0].uuid}::1", "Healthy", [0]),
        (f"{GPUS[1].uuid}::0", "Healthy", [1]),
        (f"{GPUS[1].uuid}::1", "Healthy", [1]),
        (f"{GPUS[2].uuid}::0", "Healthy", []),
        (f"{GPUS[2].uuid}::1", "Healthy", []),
    ]
    assert not first.devices[4].HasField("topology")


async def test_health_change_marks_every_replica_and_recovers(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 12, 10)
        assert k.allocatable(GPU) == 12
        node.state.publish(unhealthy=frozenset({GPUS[1].uuid}))
        await k.wait_for(lambda: k.allocatable(GPU) == 8, 10)
        assert k.capacity(GPU) == 12
        unhealthy = sorted(i for i, h in k.devices(GPU).items() if h == "Unhealthy")
        assert unhealthy == [f"{GPUS[1].uuid}::{n}" for n in range(4)]
        node.state.publish(unhealthy=frozenset())
        await k.wait_for(lambda: k.allocatable(GPU) == 12, 10)
        assert k.registrations[GPU] == 1


async def test_stream_sends_only_when_this_resource_changes(sock_dir: Path) -> None:
    p = plan(whole(GPUS[:1]), shared(GPUS[1:], 2, SHARED))
    async with running_node(sock_dir, p, INV, register=False) as node:
        gpu_sock, shared_sock = sock_dir / "nvidia-gpu.sock", sock_dir / "nvidia-gpu.shared.sock"
        await node.kubelet.wait_for(lambda: gpu_sock.is_socket() and shared_sock.is_socket(), 10)
        async with (
            grpc.aio.insecure_channel(unix_target(str(gpu_sock))) as ch1,
            grpc.aio.insecure_channel(unix_target(str(shared_sock))) as ch2,
        ):
            gpu_stream = DevicePluginClient(ch1).list_and_watch()
            shared_stream = DevicePluginClient(ch2).list_and_watch()
            assert await next_list(gpu_stream) == [(GPUS[0].uuid, "Healthy")]
            assert len(await next_list(shared_stream)) == 4
            # Versions that change only the shared resource: its stream gets each of them
            # (so both streams have seen these versions), nvidia.com/gpu's stream nothing.
            node.state.publish(plan=p)
            await asyncio.sleep(0.05)  # a version that changes nothing at all
            node.state.publish(unhealthy=frozenset({GPUS[2].uuid}))
            assert [h for _, h in await next_list(shared_stream)].count("Unhealthy") == 2
            node.state.publish(plan=plan(whole(GPUS[:1]), shared(GPUS[1:], 4, SHARED)))
            assert len(await next_list(shared_stream)) == 8
            # Now a change for nvidia.com/gpu: the next message it sees is this one.
            node.state.publish(unhealthy=frozenset({GPUS[0].uuid}))
            assert await next_list(gpu_stream) == [(GPUS[0].uuid, "Unhealthy")]
            await gpu_stream.aclose()
            await shared_stream.aclose()


async def test_plan_change_updates_lists_without_registering_again(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 4)), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 12, 10)
        node.state.publish(plan=plan(shared(GPUS, 2)))
        await k.wait_for(lambda: k.capacity(GPU) == 6, 10)
        node.state.publish(plan=plan(whole(GPUS)))
        await k.wait_for(lambda: sorted(k.devices(GPU)) == sorted(g.uuid for g in GPUS), 10)
        assert k.registrations == {GPU: 1}


async def test_resources_are_added_and_removed_on_reload(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(whole(GPUS[:1])), INV) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 1, 10)
        node.state.publish(plan=plan(whole(GPUS[:1]), shared(GPUS[1:], 3, SHARED)))
        await k.wait_for(lambda: k.capacity(SHARED) == 6, 10)
        assert (sock_dir / "nvidia-gpu.shared.sock").is_socket()
        assert node.manager.serving == {
            GPU: sock_dir / "nvidia-gpu.sock",
            SHARED: sock_dir / "nvidia-gpu.shared.sock",
        }

        # Removing the shared resource stops its server: the stream ends, the socket goes.
        node.state.publish(plan=plan(whole(GPUS[:1])))
        await k.wait_for(lambda: not k.has(SHARED), 10)
        assert not (sock_dir / "nvidia-gpu.shared.sock").exists()
        assert node.manager.serving == {GPU: sock_dir / "nvidia-gpu.sock"}

        # A resource whose devices all disappear is not served either.
        node.state.publish(plan=plan(whole([]), shared(GPUS, 2, SHARED)))
        await k.wait_for(lambda: not k.has(GPU) and k.capacity(SHARED) == 6, 10)
        assert not (sock_dir / "nvidia-gpu.sock").exists()
        assert dict(k.registrations) == {GPU: 1, SHARED: 2}


async def test_many_streams_share_one_encoded_list_of_8192_devices(sock_dir: Path) -> None:
    big = [gpu(i) for i in range(8)]
    p = plan(shared(big, 1024))
    async with running_node(sock_dir, p, inventory(big), register=False) as node:
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(socket.is_socket, 10)
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            streams = [client.list_and_watch() for _ in range(4)]
            firsts = await asyncio.gather(*(next_list(s) for s in streams))
            assert all(len(f) == 8192 for f in firsts)
            node.state.publish(unhealthy=frozenset({big[3].uuid}))
            seconds = await asyncio.gather(*(next_list(s) for s in streams))
            for s in streams:
                await s.aclose()
    assert all(second == seconds[0] for second in seconds)
    assert sum(1 for _, h in seconds[0] if h == "Unhealthy") == 1024


def test_listing_cache_encodes_once_per_version() -> None:
    state = PlanState(plan(shared(GPUS, 2)), INV)
    cache = ListingCache(GPU)
    first = cache.payload(state.current)
    assert first is not None
    assert cache.payload(state.current) is first
    state.publish(unhealthy=frozenset({GPUS[0].uuid}))
    second = cache.payload(state.current)
    assert second is not None
    assert second is not first
    decoded = api.ListAndWatchResponse.FromString(second)
    assert [d.health for d in decoded.devices] == ["Unhealthy"] * 2 + ["Healthy"] * 4
    state.publish(plan=plan(shared(GPUS, 2, SHARED)))
    assert cache.payload(state.current) is None


async def test_wait_newer_wakes_on_publish() -> None:
    state = PlanState(plan(whole(GPUS)), INV)
    waiter = asyncio.create_task(state.wait_newer(state.current.version))
    await asyncio.sleep(0)
    assert not waiter.done()
    published = state.publish(unhealthy=frozenset({GPUS[0].uuid}))
    assert await asyncio.wait_for(waiter, 5) is published
    assert published.version == 2
    assert published.plan == plan(whole(GPUS))
