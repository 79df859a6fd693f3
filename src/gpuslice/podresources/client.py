"""Client for the kubelet's PodResources `List`: which container holds which device ID.

The kubelet recreates its socket when it restarts. A gRPC channel left pointing at the old
socket would retry with exponential backoff (up to minutes), so the client watches the
socket file's identity (device, inode and change time, since inodes get reused) and opens
a fresh channel when it changes, and drops the channel after any UNAVAILABLE so the next
call connects at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from gpuslice.podresources.convert import (
    ALLOCATABLE_METHOD,
    GET_METHOD,
    LIST_METHOD,
    allocatable_of,
    assignments_of,
)
from gpuslice.ports import ContainerDevices
from gpuslice.protos.podresources.v1 import api_pb2 as pb

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
"""Mount the directory, not the file: the kubelet replaces the file on restart."""


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be asked (socket missing, kubelet down)."""


class PodResourcesClient:
    """Implements `ports.PodAssignments` against a kubelet (or `PodResourcesEmulator`)."""

    def __init__(
        self,
        socket_path: Path | str = DEFAULT_SOCKET,
        *,
        timeout_s: float = 5.0,
        dra_driver: str | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        """Per-call deadline: a scrape loop must not hang on a wedged kubelet."""
        self.dra_driver = dra_driver
        """Keep only this DRA driver's claim devices (`gpu.nvidia.com` in DRA mode); None
        keeps every driver's. Device-plugin devices are always kept."""
        self._channel: Any = None
        self._socket_identity: tuple[int, int, int] | None = None

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        resp = await self._call(
            LIST_METHOD, pb.ListPodResourcesRequest(), pb.ListPodResourcesResponse
        )
        return assignments_of(resp.pod_resources, self.dra_driver)

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """resource -> device IDs the kubelet considers allocatable on this node."""
        resp = await self._call(
            ALLOCATABLE_METHOD, pb.AllocatableResourcesRequest(), pb.AllocatableResourcesResponse
        )
        return allocatable_of(resp)

    async def get_pod(self, namespace: str, pod: str) -> tuple[ContainerDevices, ...]:
        """One pod's devices (the kubelet's `Get`, alpha behind `KubeletPodResourcesGet`)."""
        request = pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        resp = await self._call(GET_METHOD, request, pb.GetPodResourcesResponse)
        return assignments_of([resp.pod_resources], self.dra_driver)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        self._socket_identity = None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> PodResourcesClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, method: str, request: Any, response_type: Any) -> Any:
        """One unary call; reconnects once if the first attempt finds the kubelet gone."""
        for attempt in (1, 2):
            channel = await self._current_channel()
            call = channel.unary_unary(
                method,
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_type.FromString,
            )
            try:
                return await call(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await self.close()
                    if attempt == 1:
                        continue
                raise PodResourcesError(
                    f"PodResources {method.rsplit('/', 1)[-1]} on {self.socket_path} failed: "
                    f"{exc.code().name}: {exc.details()}"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _current_channel(self) -> Any:
        try:
            st = os.stat(self.socket_path)
        except OSError as exc:
            await self.close()
            raise PodResourcesError(
                f"PodResources socket {self.socket_path} is not there ({exc.strerror}); "
                "is the kubelet running and the pod-resources directory mounted?"
            ) from None
        identity = (st.st_dev, st.st_ino, st.st_ctime_ns)
        if self._channel is not None and identity != self._socket_identity:
            await self.close()
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket_path.absolute()}")
            self._socket_identity = identity
        return self._channel
