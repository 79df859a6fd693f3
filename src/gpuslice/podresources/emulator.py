"""A kubelet-side PodResources server over a real unix socket, fed from a callable.

Used by tests and `gpuslice demo`: whatever keeps the books of who holds which device (the
kubelet emulator, a test) hands in `source`, and every `List` answers from it afresh. DRA
claims come from `claims` (a `ClaimBooks`, its own unless one is shared in): `book_claim`
and `release_claim` play the kubelet after NodePrepareResources / NodeUnprepareResources,
and `List` and `Get` report them in `dynamic_resources` as the kubelet does.
`restart` recreates the socket file the way a kubelet restart does, so clients' reconnect
logic runs for real.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from gpuslice.podresources.claims import (
    ClaimBooks,
    ClaimDevice,
    ClaimDeviceSpec,
    ContainerClaim,
)
from gpuslice.podresources.convert import (
    SERVICE,
    allocatable_response,
    pod_resources,
)
from gpuslice.ports import ContainerDevices
from gpuslice.protos.podresources.v1 import api_pb2 as pb

AssignmentSource = Callable[[], tuple[ContainerDevices, ...]]
AllocatableSource = Callable[[], Mapping[str, Sequence[str]]]


class PodResourcesEmulator:
    def __init__(
        self,
        socket_path: Path | str,
        source: AssignmentSource = lambda: (),
        *,
        allocatable: AllocatableSource | None = None,
        claims: ClaimBooks | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.source = source
        self.allocatable = allocatable
        self.claims = claims if claims is not None else ClaimBooks()
        """Which container uses which DRA claim's devices (served as dynamic resources)."""
        self.list_calls = 0
        """How many `List` calls were answered (lets tests see a client reached this server)."""
        self._server: Any = None

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self._handler(),))
        server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
        await server.start()
        self._server = server

    async def stop(self, grace_s: float | None = 0.2) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def restart(self) -> None:
        """Stop, remove the socket, serve on a new one: what a kubelet restart looks like."""
        await self.stop()
        await self.start()

    def book_claim(
        self,
        namespace: str,
        pod: str,
        container: str,
        claim_namespace: str,
        claim_name: str,
        devices: Sequence[ClaimDevice | ClaimDeviceSpec],
    ) -> ContainerClaim:
        """The container uses the claim's devices, each a `ClaimDevice` or
        (driver, pool, device, share_id, CDI IDs); the next `List` reports it."""
        return self.claims.book(namespace, pod, container, claim_namespace, claim_name, devices)

    def release_claim(self, claim_namespace: str, claim_name: str) -> int:
        """The claim was unprepared: no container uses it any more."""
        return self.claims.release_claim(claim_namespace, claim_name)

    def pod_resources(self) -> list[pb.PodResources]:
        """What `List` answers now, as the kubelet's protobuf messages."""
        return pod_resources(self.source(), self.claims.entries())

    async def __aenter__(self) -> PodResourcesEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _handler(self) -> Any:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=pb.ListPodResourcesRequest.FromString,
                    response_serializer=pb.ListPodResourcesResponse.SerializeToString,
                ),
                "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                    self._allocatable,
                    request_deserializer=pb.AllocatableResourcesRequest.FromString,
                    response_serializer=pb.AllocatableResourcesResponse.SerializeToString,
                ),
                "Get": grpc.unary_unary_rpc_method_handler(
                    self._get,
                    request_deserializer=pb.GetPodResourcesRequest.FromString,
                    response_serializer=pb.GetPodResourcesResponse.SerializeToString,
                ),
            },
        )

    async def _list(
        self, request: pb.ListPodResourcesRequest, context: Any
    ) -> pb.ListPodResourcesResponse:
        self.list_calls += 1
        return pb.ListPodResourcesResponse(pod_resources=self.pod_resources())

    async def _allocatable(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        if self.allocatable is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "this emulator was started without allocatable"
            )
        assert self.allocatable is not None
        return allocatable_response(self.allocatable())

    async def _get(
        self, request: pb.GetPodResourcesRequest, context: Any
    ) -> pb.GetPodResourcesResponse:
        for pod in self.pod_resources():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod not found: {request.pod_namespace}/{request.pod_name}",
        )
        raise AssertionError("abort returns only by raising")  # pragma: no cover
