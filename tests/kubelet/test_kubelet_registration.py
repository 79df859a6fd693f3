"""Registration: what the plugin sends the kubelet, and re-registration after restarts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from tests.kubelet.kubelet_plans import gpu, inventory, plan, running_node, shared, whole

GPUS = [gpu(0, numa=0), gpu(1, numa=1)]
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def parse_fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """Hand-parse protobuf wire format: (field number, wire type, value) per field."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < len(data):
        tag = varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            out.append((number, wire, varint()))
        elif wire == 2:
            size = varint()
            out.append((number, wire, data[pos : pos + size]))
            pos += size
        else:
            raise AssertionError(f"unexpected wire type {wire} for field {number}")
    return out


async def test_registers_each_resource_with_its_socket_and_options(sock_dir: Path) -> None:
    p = plan(whole(GPUS), shared(GPUS, 4, SHARED))
    async with running_node(sock_dir, p, inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(SHARED) == 8 and k.capacity(GPU) == 2, 10)
        assert dict(k.registrations) == {GPU: 1, SHARED: 1}
        assert (sock_dir / "nvidia-gpu.sock").is_socket()
        assert (sock_dir / "nvidia-gpu.shared.sock").is_socket()
        for name in (GPU, SHARED):
            options = k.options(name)
            assert options is not None
            assert options.get_preferred_allocation_available
            assert not options.pre_start_required


async def test_register_request_bytes_use_the_kubelet_field_numbers(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(shared(GPUS, 2, SHARED)), inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.registrations[SHARED] == 1, 10)
        (raw,) = k.register_requests
    fields = parse_fields(raw)
    assert fields == [
        (1, 2, b"v1beta1"),
        (2, 2, b"nvidia-gpu.shared.sock"),
        (3, 2, b"nvidia.com/gpu.shared"),
        (4, 2, bytes([2 << 3 | 0, 1])),  # options { get_preferred_allocation_available (2): true }
    ]


def test_proto_field_numbers_match_the_published_api() -> None:
    expected = {
        "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
        "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
        "Empty": {},
        "ListAndWatchResponse": {"devices": 1},
        "TopologyInfo": {"nodes": 1},
        "NUMANode": {"ID": 1},
        "Device": {"ID": 1, "health": 2, "topology": 3},
        "PreStartContainerRequest": {"devices_ids": 1},
        "PreStartContainerResponse": {},
        "PreferredAllocationRequest": {"container_requests": 1},
        "ContainerPreferredAllocationRequest": {
            "available_deviceIDs": 1,
            "must_include_deviceIDs": 2,
            "allocation_size": 3,
        },
        "PreferredAllocationResponse": {"container_responses": 1},
        "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
        "AllocateRequest": {"container_requests": 1},
        "ContainerAllocateRequest": {"devices_ids": 1},
        "CDIDevice": {"name": 1},
        "AllocateResponse": {"container_responses": 1},
        "ContainerAllocateResponse": {
            "envs": 1,
            "mounts": 2,
            "devices": 3,
            "annotations": 4,
            "cdi_devices": 5,
        },
        "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
        "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
    }
    file = api.DESCRIPTOR
    assert file.package == "v1beta1"
    got = {
        name: {f.name: f.number for f in msg.fields}
        for name, msg in file.message_types_by_name.items()
    }
    assert got == expected
    services = {s.full_name: [m.name for m in s.methods] for s in file.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }


async def test_standalone_serves_without_registering(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(whole(GPUS)), inventory(GPUS), register=False) as node:
        socket = sock_dir / "nvidia-gpu.sock"
        await node.kubelet.wait_for(lambda: socket.is_socket(), 10)
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            options = await client.get_device_plugin_options(timeout_s=5)
            assert options.get_preferred_allocation_available
            stream = client.list_and_watch()
            first = await anext(stream)
            await stream.aclose()
        assert [d.ID for d in first.devices] == [g.uuid for g in GPUS]
        assert node.kubelet.registrations == {}
        assert node.kubelet.register_requests == []


async def test_kubelet_started_late_gets_registered(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuslice.test.kubelet")
    async with running_node(
        sock_dir, plan(whole(GPUS)), inventory(GPUS), kubelet_first=False
    ) as node:
        k = node.kubelet
        await k.wait_for(lambda: "event=register-failed" in caplog.text, 10)
        assert (sock_dir / "nvidia-gpu.sock").is_socket()
        await k.start()
        await k.wait_for(lambda: k.capacity(GPU) == 2, 10)
        assert k.registrations[GPU] == 1
    assert "event=registered resource=nvidia.com/gpu socket=nvidia-gpu.sock" in caplog.text


async def test_refused_registration_is_retried_and_plugin_keeps_serving(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gpuslice.test.kubelet")
    # A resource name without a domain: the kubelet refuses to register it.
    p = plan(whole(GPUS, name="gpu"), shared(GPUS, 2, SHARED))
    async with running_node(sock_dir, p, inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: caplog.text.count("event=register-failed resource=gpu ") >= 2, 10)
        assert "the ResourceName" in caplog.text
        assert k.registrations == {SHARED: 1}
        assert (sock_dir / "nvidia-gpu.sock").is_socket()
        assert not node.stop.is_set()


async def test_kubelet_restarts_twenty_times_and_each_gets_one_registration(
    sock_dir: Path,
) -> None:
    p = plan(whole(GPUS), shared(GPUS, 4, SHARED))
    async with running_node(sock_dir, p, inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(SHARED) == 8 and k.capacity(GPU) == 2, 10)
        for n in range(2, 22):
            await k.restart()
            assert not k.has(GPU)
            await k.wait_for(
                lambda n=n: (
                    k.registrations[GPU] == n  # type: ignore[misc]
                    and k.registrations[SHARED] == n
                    and k.capacity(SHARED) == 8
                    and k.capacity(GPU) == 2
                ),
                10,
            )
        # Let the socket watcher run a few more rounds: no extra registration may follow.
        await asyncio.sleep(0.3)
        assert dict(k.registrations) == {GPU: 21, SHARED: 21}


async def test_deleted_plugin_socket_is_recreated_and_registered_again(sock_dir: Path) -> None:
    async with running_node(sock_dir, plan(whole(GPUS)), inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 2, 10)
        (sock_dir / "nvidia-gpu.sock").unlink()
        await k.wait_for(lambda: k.registrations[GPU] == 2 and k.capacity(GPU) == 2, 10)
        assert (sock_dir / "nvidia-gpu.sock").is_socket()


async def test_shutdown_ends_streams_and_removes_sockets(sock_dir: Path) -> None:
    p = plan(whole(GPUS), shared(GPUS, 4, SHARED))
    async with running_node(sock_dir, p, inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.has(SHARED) and k.has(GPU), 10)
        node.stop.set()
        # The kubelet sees the streams end (and forgets the plugins) once the servers stop.
        await k.wait_for(lambda: not k.resources(), 10)
    assert files_in(sock_dir) == []


async def test_new_kubelet_socket_alone_triggers_registration(sock_dir: Path) -> None:
    """A kubelet that comes back without deleting our sockets still gets a Register."""
    async with running_node(sock_dir, plan(whole(GPUS)), inventory(GPUS)) as node:
        k = node.kubelet
        await k.wait_for(lambda: k.capacity(GPU) == 2, 10)
        plugin_socket = (sock_dir / "nvidia-gpu.sock").stat()
        await k.stop()
        await k.start()
        await k.wait_for(lambda: k.registrations[GPU] == 2 and k.capacity(GPU) == 2, 10)
        assert (sock_dir / "nvidia-gpu.sock").stat().st_ino == plugin_socket.st_ino
