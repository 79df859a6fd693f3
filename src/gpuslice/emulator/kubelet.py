"""The kubelet's device-manager side, played over real unix sockets.

Tests and `gpuslice demo` run the real plugin servers against this: it serves Registration
on `<dir>/kubelet.sock`, dials each registered plugin, keeps the device lists its
ListAndWatch streams send, and admits pods the way the kubelet does (free healthy devices,
GetPreferredAllocation when offered, then Allocate), with the kubelet's error texts.

Deliberate simplifications: a plugin whose stream ends is forgotten at once (the kubelet
keeps its capacity, with no allocatable devices, for five minutes); allocations are kept
across `restart()` (the kubelet keeps them in a checkpoint file).
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.sockets import socket_identity
from gpuslice.emulator.admission import (
    Admission,
    AdmissionError,
    ContainerAdmission,
    ResourceAllocation,
    rpc_failed,
    unavailable,
)
from gpuslice.kubelet.convert import allocate_request, allocation_from_proto, preferred_request
from gpuslice.kubelet.rpc import VERSION, DevicePluginClient, registration_handler, unix_target
from gpuslice.logs import get_logger
from gpuslice.ports import ContainerDevices
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api

__all__ = ["Admission", "AdmissionError", "ContainerAdmission", "KubeletEmulator"]

KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"


@dataclass(slots=True)
class _Endpoint:
    resource: str
    socket: Path
    channel: grpc.aio.Channel
    client: DevicePluginClient
    options: api.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)
    """Device ID -> health, in the order the plugin sent them."""
    stream: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class _Held:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class KubeletEmulator:
    def __init__(
        self,
        plugin_dir: Path,
        *,
        rpc_timeout_s: float = 10.0,
        logger: BoundLogger | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self._timeout = rpc_timeout_s
        self._log = logger or get_logger("gpuslice.emulator")
        self._server: grpc.aio.Server | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        self._held: list[_Held] = []
        self._admit_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self.registrations: Counter[str] = Counter()
        """Register calls accepted, per resource name."""
        self.register_requests: list[bytes] = []
        """Every RegisterRequest exactly as received on the wire."""

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("kubelet emulator already started")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((registration_handler(self),))
        server.add_insecure_port(unix_target(str(self.socket_path)))
        await server.start()
        self._server = server
        self._log.info("kubelet-started", socket=str(self.socket_path))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0.5)
        # A plugin that has stopped (its socket is gone) is ending its stream: let that end
        # arrive instead of cancelling the call, which would leave gRPC's status handling
        # for it still running after we return.
        ending = [
            e.stream
            for e in self._endpoints.values()
            if e.stream is not None and socket_identity(e.socket) is None
        ]
        if ending:
            await asyncio.wait(ending, timeout=1.0)
        for resource in list(self._endpoints):
            await self._drop(resource)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def restart(self) -> None:
        """Like a new kubelet: stop, delete every socket in the directory, start again."""
        await self.stop()
        for path in self.plugin_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
        await self.start()

    # -- Registration service --------------------------------------------------------------

    async def register(self, request: bytes, context: grpc.aio.ServicerContext) -> api.Empty:
        self.register_requests.append(request)
        req = api.RegisterRequest.FromString(request)
        problem = _registration_problem(req)
        if problem is None:
            try:
                await self._connect(req)
            except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
                problem = f"failed to dial device plugin {req.endpoint}: {exc!r}"
        if problem is not None:
            self._log.warning("registration-refused", error=problem)
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        self.registrations[req.resource_name] += 1
        self._notify()
        self._log.info("registration", resource=req.resource_name, endpoint=req.endpoint)
        return api.Empty()

    async def _connect(self, req: api.RegisterRequest) -> None:
        socket = self.plugin_dir / req.endpoint
        channel = grpc.aio.insecure_channel(unix_target(str(socket)))
        try:
            await asyncio.wait_for(channel.channel_ready(), self._timeout)
            client = DevicePluginClient(channel)
            options = await client.get_device_plugin_options(timeout_s=self._timeout)
        except BaseException:
            await channel.close()
            raise
        if req.resource_name in self._endpoints:
            await self._drop(req.resource_name)
        endpoint = _Endpoint(req.resource_name, socket, channel, client, options)
        self._endpoints[req.resource_name] = endpoint
        endpoint.stream = asyncio.create_task(
            self._watch(endpoint), name=f"kubelet-emulator-law-{req.resource_name}"
        )

    async def _watch(self, endpoint: _Endpoint) -> None:
        try:
            async for response in endpoint.client.list_and_watch():
                endpoint.devices = {d.ID: d.health for d in response.devices}
                self._notify()
        except grpc.aio.AioRpcError as exc:
            self._log.info("list-and-watch-ended", resource=endpoint.resource, code=str(exc.code()))
        if self._endpoints.get(endpoint.resource) is endpoint:
            del self._endpoints[endpoint.resource]
            await endpoint.channel.close()
            self._notify()

    async def _drop(self, resource: str) -> None:
        endpoint = self._endpoints.pop(resource)
        if endpoint.stream is not None and endpoint.stream is not asyncio.current_task():
            endpoint.stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await endpoint.stream
        await endpoint.channel.close()
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- node status -----------------------------------------------------------------------

    def resources(self) -> tuple[str, ...]:
        return tuple(sorted(self._endpoints))

    def has(self, resource: str) -> bool:
        return resource in self._endpoints

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> "Healthy"/"Unhealthy", as the plugin last sent them."""
        endpoint = self._endpoints.get(resource)
        return dict(endpoint.devices) if endpoint is not None else {}

    def options(self, resource: str) -> api.DevicePluginOptions | None:
        endpoint = self._endpoints.get(resource)
        return endpoint.options if endpoint is not None else None

    def capacity(self, resource: str) -> int:
        return len(self.devices(resource))

    def allocatable(self, resource: str) -> int:
        """Healthy devices: unhealthy ones leave capacity but not allocatable."""
        return sum(1 for h in self.devices(resource).values() if h == HEALTHY)

    def free(self, resource: str) -> tuple[str, ...]:
        """Healthy devices no pod holds."""
        return self._free(resource, set())

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109 - a deadline for the whole wait, as tests read it
        """Return once `predicate()` holds; TimeoutError after `timeout` seconds.

        Re-checked on every change the emulator sees, and every 20 ms for predicates about
        anything else (files in the plugin directory, the plugin's state).
        """
        async with asyncio.timeout(timeout):
            while not predicate():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.02)

    # -- pods ------------------------------------------------------------------------------

    async def admit(
        self,
        namespace: str,
        pod: str,
        containers: Sequence[tuple[str, Mapping[str, int]]],
    ) -> Admission:
        async with self._admit_lock:
            if any(h.namespace == namespace and h.pod == pod for h in self._held):
                raise AdmissionError(f"pod {namespace}/{pod} is already admitted")
            taken: set[tuple[str, str]] = set()
            held: list[_Held] = []
            admitted: list[ContainerAdmission] = []
            for container, requests in containers:
                allocations: list[ResourceAllocation] = []
                for resource, count in requests.items():
                    if count <= 0:
                        continue
                    alloc = await self._allocate(resource, count, taken)
                    allocations.append(alloc)
                    taken.update((resource, i) for i in alloc.device_ids)
                    held.append(_Held(namespace, pod, container, resource, alloc.device_ids))
                admitted.append(ContainerAdmission(container, tuple(allocations)))
            self._held.extend(held)
            self._notify()
            return Admission(namespace, pod, tuple(admitted))

    async def delete_pod(self, namespace: str, pod: str) -> None:
        self._held = [h for h in self._held if (h.namespace, h.pod) != (namespace, pod)]
        self._notify()

    def assignments(self) -> tuple[ContainerDevices, ...]:
        return tuple(
            ContainerDevices(h.namespace, h.pod, h.container, h.resource, h.device_ids)
            for h in self._held
        )

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        """`gpuslice.ports.PodAssignments`: the emulator's books stand in for PodResources."""
        return self.assignments()

    def _free(self, resource: str, taken: set[tuple[str, str]]) -> tuple[str, ...]:
        held = {i for h in self._held if h.resource == resource for i in h.device_ids}
        return tuple(
            i
            for i, health in self.devices(resource).items()
            if health == HEALTHY and i not in held and (resource, i) not in taken
        )

    async def _allocate(
        self, resource: str, count: int, taken: set[tuple[str, str]]
    ) -> ResourceAllocation:
        endpoint = self._endpoints.get(resource)
        free = self._free(resource, taken)
        if endpoint is None or len(free) < count:
            raise unavailable(resource, count, len(free))
        try:
            chosen = await self._choose(endpoint, free, count)
            response = await endpoint.client.allocate(
                allocate_request(chosen), timeout_s=self._timeout
            )
            if endpoint.options.pre_start_required:
                await endpoint.client.pre_start_container(
                    api.PreStartContainerRequest(devices_ids=chosen), timeout_s=self._timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise rpc_failed(exc.code().name, exc.details() or "") from None
        if len(response.container_responses) != 1:
            raise AdmissionError(
                f"Allocate failed due to plugin returned {len(response.container_responses)} "
                "container responses for 1 request, which is unexpected"
            )
        return ResourceAllocation(
            resource, tuple(chosen), allocation_from_proto(response.container_responses[0])
        )

    async def _choose(self, endpoint: _Endpoint, free: Sequence[str], count: int) -> list[str]:
        """The plugin's preference where it offers one, topped up from the free list."""
        chosen: list[str] = []
        if endpoint.options.get_preferred_allocation_available:
            preferred = await endpoint.client.get_preferred_allocation(
                preferred_request(free, (), count), timeout_s=self._timeout
            )
            if preferred.container_responses:
                free_set = set(free)
                for i in preferred.container_responses[0].deviceIDs:
                    if i in free_set and i not in chosen and len(chosen) < count:
                        chosen.append(i)
        for i in free:
            if len(chosen) == count:
                break
            if i not in chosen:
                chosen.append(i)
        return chosen


def _registration_problem(req: api.RegisterRequest) -> str | None:
    """The kubelet's checks before it dials a plugin (its wording)."""
    if req.version != VERSION:
        return (
            f'requested API version "{req.version}" is not supported by kubelet. '
            f'Supported versions are ["{VERSION}"]'
        )
    name = req.resource_name
    domain, sep, _ = name.partition("/")
    if not sep or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f'the ResourceName "{name}" is invalid'
    if not req.endpoint or "/" in req.endpoint:
        return f'invalid endpoint "{req.endpoint}": a socket file name in the plugin directory'
    return None
