"""DRA claims through the kubelet's PodResources API, over real gRPC on a unix socket.

The kubelet reports claims in `ContainerResources.dynamic_resources`; the agent only sees
them through `PodResourcesClient.list_assignments`, so each test goes emulator -> protobuf
on the wire -> client, the path production takes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.podresources import (
    ClaimBooks,
    ClaimDevice,
    PodResourcesClient,
    PodResourcesEmulator,
    PodResourcesError,
)
from gpuslice.podresources.convert import assignments_of
from gpuslice.ports import ContainerDevices
from gpuslice.protos.podresources.v1 import api_pb2 as pb

DRIVER = "gpu.nvidia.com"
NIC = "nic.example.com"
PLUGIN = ContainerDevices("ml", "train", "main", "nvidia.com/gpu.shared", ("GPU-a::0",))


async def test_claim_devices_become_claim_resources(sock_dir: Path) -> None:
    """A whole device, a share (its shareID in the ID) and a device-plugin resource in the
    same container all come back, each under its own resource name."""
    path = sock_dir / "k.sock"
    async with (
        PodResourcesEmulator(path, lambda: (PLUGIN,)) as emulator,
        PodResourcesClient(path) as client,
    ):
        emulator.book_claim(
            "ml",
            "train",
            "main",
            "ml",
            "gpu-claim",
            [
                (DRIVER, "node-1", "gpu-0", None, ["k8s.gpuslice.io/claim=u1-gpu-0"]),
                (DRIVER, "node-1", "gpu-1", "3f2a", ["k8s.gpuslice.io/claim=u1-gpu-1"]),
            ],
        )
        got = await client.list_assignments()
    assert set(got) == {
        PLUGIN,
        ContainerDevices(
            "ml", "train", "main", "claim:ml/gpu-claim", ("node-1/gpu-0", "node-1/gpu-1/3f2a")
        ),
    }


async def test_driver_filter_keeps_only_that_drivers_devices(sock_dir: Path) -> None:
    """A claim may also hold another driver's device (a NIC); in DRA mode the agent asks
    for its own driver's only, and a claim left with none is not listed at all."""
    path = sock_dir / "k.sock"
    async with PodResourcesEmulator(path) as emulator:
        emulator.book_claim(
            "ml",
            "train",
            "main",
            "ml",
            "mixed",
            [(DRIVER, "node-1", "gpu-0", None, ()), (NIC, "node-1", "eth1", None, ())],
        )
        emulator.book_claim(
            "ml", "train", "main", "ml", "nic-only", [(NIC, "node-1", "eth2", None, ())]
        )
        async with PodResourcesClient(path, dra_driver=DRIVER) as ours:
            filtered = await ours.list_assignments()
            one_pod = await ours.get_pod("ml", "train")
        async with PodResourcesClient(path) as everyone:
            unfiltered = await everyone.list_assignments()
    mixed = ContainerDevices("ml", "train", "main", "claim:ml/mixed", ("node-1/gpu-0",))
    assert filtered == (mixed,)
    assert one_pod == (mixed,)
    assert set(unfiltered) == {
        ContainerDevices("ml", "train", "main", "claim:ml/mixed", ("node-1/gpu-0", "node-1/eth1")),
        ContainerDevices("ml", "train", "main", "claim:ml/nic-only", ("node-1/eth2",)),
    }


async def test_claim_in_another_namespace_and_release(sock_dir: Path) -> None:
    """The resource names the claim's own namespace (the kubelet's `claim_namespace`), and
    releasing a claim (unprepare) removes it from every container that used it."""
    path = sock_dir / "k.sock"
    books = ClaimBooks()
    shared = [ClaimDevice(DRIVER, "node-1", "gpu-0")]
    async with (
        PodResourcesEmulator(path, claims=books) as emulator,
        PodResourcesClient(path, dra_driver=DRIVER) as client,
    ):
        books.book("a", "p1", "c", "shared-ns", "big", shared)
        emulator.book_claim("b", "p2", "c", "shared-ns", "big", shared)
        emulator.book_claim("b", "p2", "c", "b", "own", [(DRIVER, "node-1", "gpu-1", "", ())])
        assert {(a.namespace, a.pod, a.resource) for a in await client.list_assignments()} == {
            ("a", "p1", "claim:shared-ns/big"),
            ("b", "p2", "claim:shared-ns/big"),
            ("b", "p2", "claim:b/own"),
        }
        assert emulator.release_claim("shared-ns", "big") == 2
        assert await client.list_assignments() == (
            ContainerDevices("b", "p2", "c", "claim:b/own", ("node-1/gpu-1",)),
        )
        assert books.remove_pod("b", "p2") == 1
        assert await client.list_assignments() == ()
        with pytest.raises(PodResourcesError, match="NOT_FOUND"):
            await client.get_pod("b", "p2")


async def test_booking_again_replaces_and_keeps_cdi_ids_on_the_wire(sock_dir: Path) -> None:
    """The wire form is the kubelet's: CDI IDs and an explicitly set share_id survive, and
    a container's second booking of the same claim replaces the first."""
    path = sock_dir / "k.sock"
    async with PodResourcesEmulator(path) as emulator:
        emulator.book_claim("n", "p", "c", "n", "x", [(DRIVER, "pool", "gpu-0", None, ())])
        emulator.book_claim("n", "p", "c", "n", "x", [(DRIVER, "pool", "gpu-1", "s1", ["k=v"])])
        (pod,) = emulator.pod_resources()
    (container,) = pod.containers
    assert list(container.devices) == []
    (dynamic,) = container.dynamic_resources
    (res,) = dynamic.claim_resources
    assert (dynamic.claim_namespace, dynamic.claim_name) == ("n", "x")
    assert (res.driver_name, res.pool_name, res.device_name) == (DRIVER, "pool", "gpu-1")
    assert res.HasField("share_id")
    assert res.share_id == "s1"
    assert [d.name for d in res.cdi_devices] == ["k=v"]


def test_share_id_absent_versus_empty() -> None:
    """A kubelet older than 1.35 never sets share_id: the ID is `<pool>/<device>`; set,
    even to a value, it is appended. Built by hand, as another kubelet would send it."""
    whole = pb.ClaimResource(driver_name=DRIVER, pool_name="p", device_name="gpu-0")
    share = pb.ClaimResource(driver_name=DRIVER, pool_name="p", device_name="gpu-0", share_id="7")
    pods = [
        pb.PodResources(
            name="p",
            namespace="n",
            containers=[
                pb.ContainerResources(
                    name="c",
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_name="x", claim_namespace="n", claim_resources=[whole, share]
                        ),
                        pb.DynamicResource(claim_name="empty", claim_namespace="n"),
                    ],
                )
            ],
        )
    ]
    assert assignments_of(pods) == (
        ContainerDevices("n", "p", "c", "claim:n/x", ("p/gpu-0", "p/gpu-0/7")),
    )
