"""PodResources client against the emulator over real unix sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.podresources import PodResourcesClient, PodResourcesEmulator, PodResourcesError
from gpuslice.ports import ContainerDevices

A = ContainerDevices("team-a", "train-0", "main", "nvidia.com/gpu.shared", ("GPU-a::0",))
B = ContainerDevices("team-a", "train-0", "sidecar", "nvidia.com/gpu.shared", ("GPU-a::1",))
C = ContainerDevices("team-b", "infer", "srv", "nvidia.com/mig-1g.10gb", ("MIG-x", "MIG-y"))


async def test_list_round_trips_nested_pods(sock_dir: Path) -> None:
    books = [A, B, C]
    async with (
        PodResourcesEmulator(sock_dir / "kubelet.sock", lambda: tuple(books)),
        PodResourcesClient(sock_dir / "kubelet.sock") as client,
    ):
        assert set(await client.list_assignments()) == {A, B, C}
        books.remove(B)
        assert set(await client.list_assignments()) == {A, C}


async def test_same_container_two_resources_and_empty_device_lists(sock_dir: Path) -> None:
    gpu = ContainerDevices("ns", "p", "c", "nvidia.com/gpu", ("GPU-b",))
    empty = ContainerDevices("ns", "p", "c", "example.com/nic", ())
    async with (
        PodResourcesEmulator(sock_dir / "k.sock", lambda: (A, gpu, empty)),
        PodResourcesClient(sock_dir / "k.sock") as client,
    ):
        got = await client.list_assignments()
    assert set(got) == {A, gpu}


async def test_allocatable_and_get(sock_dir: Path) -> None:
    alloc = {"nvidia.com/gpu.shared": ["GPU-a::0", "GPU-a::1"], "nvidia.com/gpu": ["GPU-b"]}
    async with (
        PodResourcesEmulator(sock_dir / "k.sock", lambda: (A, B, C), allocatable=lambda: alloc),
        PodResourcesClient(sock_dir / "k.sock") as client,
    ):
        assert await client.allocatable() == {k: tuple(v) for k, v in alloc.items()}
        assert set(await client.get_pod("team-a", "train-0")) == {A, B}
        with pytest.raises(PodResourcesError, match=r"NOT_FOUND.*team-b/nope"):
            await client.get_pod("team-b", "nope")


async def test_allocatable_without_source_is_unimplemented(sock_dir: Path) -> None:
    async with (
        PodResourcesEmulator(sock_dir / "k.sock", lambda: ()),
        PodResourcesClient(sock_dir / "k.sock") as client,
    ):
        with pytest.raises(PodResourcesError, match="UNIMPLEMENTED"):
            await client.allocatable()


async def test_client_reconnects_after_kubelet_restart(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    emulator = PodResourcesEmulator(path, lambda: (A,))
    async with emulator, PodResourcesClient(path, timeout_s=5) as client:
        assert await client.list_assignments() == (A,)
        await emulator.stop()
        with pytest.raises(PodResourcesError, match="not there"):
            await client.list_assignments()
        emulator.source = lambda: (A, C)
        await emulator.start()
        assert set(await client.list_assignments()) == {A, C}
        # A restart between two calls, with the channel still open, is also followed.
        await emulator.restart()
        calls = emulator.list_calls
        assert set(await client.list_assignments()) == {A, C}
        assert emulator.list_calls == calls + 1


async def test_missing_socket_error_names_the_path(sock_dir: Path) -> None:
    async with PodResourcesClient(sock_dir / "absent.sock") as client:
        with pytest.raises(PodResourcesError, match=r"absent\.sock.*mounted"):
            await client.list_assignments()
