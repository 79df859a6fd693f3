"""The DevicePlugin service for one advertised resource.

It holds no devices of its own: every call reads the current `Snapshot`, so a config
reload or a health change is visible to the next Allocate and to every open ListAndWatch
stream without restarting the server.

Error codes: an `AllocationError` (bad request: unknown ID, too many shared devices, not
enough devices to prefer) is returned as `UNKNOWN` with the core's message. That is the
code NVIDIA's plugin produces (it returns a plain Go error), so the kubelet's event reads
exactly as before: "Allocate failed due to rpc error: code = Unknown desc = invalid
allocation request for ...", and existing alerts and runbooks keep matching. Anything else
is our bug: it is logged with its traceback and returned as `INTERNAL`, and the server keeps
serving.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from uuid import uuid4

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.waiting import unless_stopped
from gpuslice.core.allocation.caps import AllocateCaps
from gpuslice.core.allocation.preferred import preferred_allocation
from gpuslice.core.allocation.response import CONTROL_DEVICE_NODES, build_allocation
from gpuslice.core.allocation.validation import device_lookup
from gpuslice.core.errors import AllocationError
from gpuslice.core.sharing.model import AdvertisedDevice
from gpuslice.core.text import shown
from gpuslice.kubelet.convert import allocation_to_proto, device_list, plugin_options
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.state import PlanState, Snapshot


def existing_dev_nodes() -> frozenset[str]:
    """The optional control nodes present in our container: only those become device specs."""
    return frozenset(p for p in CONTROL_DEVICE_NODES if os.path.exists(p))


class ListingCache:
    """One encoded device list per (resource, plan version), shared by every stream."""

    def __init__(self, resource_name: str) -> None:
        self._resource_name = resource_name
        self._version = -1
        self._payload: bytes | None = None

    def payload(self, snapshot: Snapshot) -> bytes | None:
        """The serialized ListAndWatchResponse, or None if the resource is not in the plan."""
        if snapshot.version != self._version:
            resource = snapshot.plan.resource(self._resource_name)
            self._payload = (
                None
                if resource is None
                else device_list(resource, snapshot.out_of_service).SerializeToString()
            )
            self._version = snapshot.version
        return self._payload


AllocateObserver = Callable[[str, bool, float], None]
"""Told (resource, succeeded, seconds) after every Allocate: the metrics counters."""

CapsSource = Callable[[], AllocateCaps | None]
"""The node's memory caps as the agent found them, read at each Allocate (the agent finds
them after the servers start, and a GPU whose NVML calls fail leaves caps later)."""


class DevicePluginServicer:
    """Answers the kubelet for one resource; `stopping` ends its ListAndWatch streams."""

    def __init__(
        self,
        state: PlanState,
        resource_name: str,
        *,
        listing: ListingCache,
        stopping: asyncio.Event,
        logger: BoundLogger,
        dev_nodes_probe: Callable[[], frozenset[str]] = existing_dev_nodes,
        on_allocate: AllocateObserver | None = None,
        caps: CapsSource | None = None,
    ) -> None:
        self._state = state
        self._caps = caps
        self._name = resource_name
        self._listing = listing
        self._stopping = stopping
        self._log = logger
        self._dev_nodes_probe = dev_nodes_probe
        self._on_allocate = on_allocate
        self._lookup: tuple[int, Mapping[str, AdvertisedDevice]] = (-1, {})
        """(plan version, ID -> device): built once per version, not once per Allocate."""

    async def get_device_plugin_options(
        self, request: api.Empty, context: grpc.aio.ServicerContext
    ) -> api.DevicePluginOptions:
        return plugin_options()

    async def list_and_watch(
        self, request: api.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self._log.info("list-and-watch-open", resource=self._name)
        snapshot = self._state.current
        sent: bytes | None = None
        try:
            while True:
                payload = self._listing.payload(snapshot)
                if payload is None:
                    return
                if payload != sent:
                    yield payload
                    sent = payload
                newer = await unless_stopped(
                    self._stopping, self._state.wait_newer(snapshot.version)
                )
                if newer is None:
                    return
                snapshot = newer
        finally:
            self._log.info("list-and-watch-closed", resource=self._name)

    async def get_preferred_allocation(
        self, request: api.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api.PreferredAllocationResponse:
        snapshot = self._state.current
        resource = snapshot.plan.resource(self._name)
        if resource is None:
            await context.abort(grpc.StatusCode.UNKNOWN, self._gone())
        assert resource is not None
        error: tuple[grpc.StatusCode, str] | None = None
        responses: list[api.ContainerPreferredAllocationResponse] = []
        try:
            for req in request.container_requests:
                ids = preferred_allocation(
                    resource,
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                    policy=snapshot.plan.allocate.allocation_policy,
                    inventory=snapshot.inventory,
                )
                responses.append(api.ContainerPreferredAllocationResponse(deviceIDs=list(ids)))
        except AllocationError as exc:
            self._log.warning("preferred-allocation-refused", resource=self._name, error=str(exc))
            error = (grpc.StatusCode.UNKNOWN, str(exc))
        except Exception as exc:
            self._log.exception("preferred-allocation-failed", resource=self._name)
            error = (grpc.StatusCode.INTERNAL, f"internal error in gpuslice: {exc!r}")
        if error is not None:
            await context.abort(*error)
        for reply in responses:
            self._log.info("preferred", resource=self._name, devices=",".join(reply.deviceIDs))
        return api.PreferredAllocationResponse(container_responses=responses)

    async def allocate(
        self, request: api.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api.AllocateResponse:
        started = time.perf_counter()
        snapshot = self._state.current
        resource = snapshot.plan.resource(self._name)
        if resource is None:
            self._observe(False, started)
            await context.abort(grpc.StatusCode.UNKNOWN, self._gone())
        assert resource is not None
        error: tuple[grpc.StatusCode, str] | None = None
        responses: list[api.ContainerAllocateResponse] = []
        try:
            dev_nodes = self._dev_nodes_probe()
            caps = None if self._caps is None else self._caps()
            if self._lookup[0] != snapshot.version:
                self._lookup = (snapshot.version, device_lookup(resource))
            for req in request.container_requests:
                alloc = build_allocation(
                    resource,
                    snapshot.plan.allocate,
                    list(req.devices_ids),
                    annotation_id=str(uuid4()),
                    dev_nodes=dev_nodes,
                    lookup=self._lookup[1],
                    caps=caps,
                )
                responses.append(allocation_to_proto(alloc))
        except AllocationError as exc:
            self._log.warning("allocate-refused", resource=self._name, error=str(exc))
            error = (grpc.StatusCode.UNKNOWN, str(exc))
        except Exception as exc:
            self._log.exception("allocate-failed", resource=self._name)
            error = (grpc.StatusCode.INTERNAL, f"internal error in gpuslice: {exc!r}")
        self._observe(error is None, started)
        if error is not None:
            await context.abort(*error)
        ids = ",".join(shown(i) for r in request.container_requests for i in r.devices_ids)
        self._log.info("allocated", resource=self._name, devices=ids)
        return api.AllocateResponse(container_responses=responses)

    async def pre_start_container(
        self, request: api.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api.PreStartContainerResponse:
        return api.PreStartContainerResponse()

    def _observe(self, ok: bool, started: float) -> None:
        if self._on_allocate is not None:
            self._on_allocate(self._name, ok, time.perf_counter() - started)

    def _gone(self) -> str:
        return f'resource "{self._name}" is no longer advertised by this node'
