"""The DRA and plugin-registration gRPC plumbing, by hand like `kubelet.rpc`.

Generic handlers with explicit (de)serializers keep every call typed under mypy --strict.
The service names come from the generated descriptors, so a proto whose `package` line
were wrong would change the wire names here too, and `tests/dra/test_wire_names.py`
catches it: the kubelet calls `/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`, not
`/v1.DRAPlugin/...`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.protos.drahealth.v1alpha1 import api_pb2 as health
from gpuslice.protos.pluginregistration.v1 import api_pb2 as reg

V1_SERVICE = v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
V1BETA1_SERVICE = v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
REGISTRATION_SERVICE = reg.DESCRIPTOR.services_by_name["Registration"].full_name
HEALTH_SERVICE = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
"""`v1alpha1.DRAResourceHealth`: the health proto's package is plain `v1alpha1`."""

V1_ADVERTISED = "v1.DRAPlugin"
"""How a plugin advertises the v1 service in `PluginInfo.supported_versions`."""
V1BETA1_ADVERTISED = "v1beta1.DRAPlugin"
SUPPORTED_VERSIONS = (V1_ADVERTISED, V1BETA1_ADVERTISED)
"""What gpuslice serves, newest first: the kubelet takes the first it knows."""
HEALTH_ADVERTISED = "v1alpha1.DRAResourceHealth"
"""Advertised after the DRAPlugin versions when the driver streams device health: the
kubelet picks its DRAPlugin version from the list and the health service separately."""
PLUGIN_TYPE = "DRAPlugin"
"""`PluginInfo.type` of a DRA driver."""

PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"
WATCH_RESOURCES = "NodeWatchResources"
GET_INFO = "GetInfo"
NOTIFY = "NotifyRegistrationStatus"

M = TypeVar("M", bound=Message)


def method_path(service: str, method: str) -> str:
    """The HTTP/2 path gRPC puts on the wire for `service`'s `method`."""
    return f"/{service}/{method}"


def unix_target(path: str) -> str:
    return f"unix:{path}"


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _deserializer(cls: type[M]) -> Callable[[bytes], M]:
    def parse(data: bytes) -> M:
        return cls.FromString(data)

    return parse


# -- server side ---------------------------------------------------------------------------


class DraService(Protocol):
    """What the DRA socket answers, for both API versions."""

    async def prepare_v1(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodePrepareResourcesResponse: ...

    async def unprepare_v1(
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse: ...

    async def prepare_v1beta1(
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse: ...

    async def unprepare_v1beta1(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse: ...


class RegistrationService(Protocol):
    """What the plugin's registration socket answers to the kubelet's plugin watcher."""

    async def get_info(
        self, request: reg.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reg.PluginInfo: ...

    async def notify_registration_status(
        self, request: reg.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> reg.RegistrationStatusResponse: ...


def dra_handlers(service: DraService) -> tuple[grpc.GenericRpcHandler, ...]:
    """Handlers for both DRAPlugin services, to be served on the same socket."""
    unary = grpc.unary_unary_rpc_method_handler
    return (
        grpc.method_handlers_generic_handler(
            V1_SERVICE,
            {
                PREPARE: unary(
                    service.prepare_v1,
                    request_deserializer=_deserializer(v1.NodePrepareResourcesRequest),
                    response_serializer=_serialize,
                ),
                UNPREPARE: unary(
                    service.unprepare_v1,
                    request_deserializer=_deserializer(v1.NodeUnprepareResourcesRequest),
                    response_serializer=_serialize,
                ),
            },
        ),
        grpc.method_handlers_generic_handler(
            V1BETA1_SERVICE,
            {
                PREPARE: unary(
                    service.prepare_v1beta1,
                    request_deserializer=_deserializer(v1beta1.NodePrepareResourcesRequest),
                    response_serializer=_serialize,
                ),
                UNPREPARE: unary(
                    service.unprepare_v1beta1,
                    request_deserializer=_deserializer(v1beta1.NodeUnprepareResourcesRequest),
                    response_serializer=_serialize,
                ),
            },
        ),
    )


class HealthService(Protocol):
    """The optional device health service on the DRA socket (server streaming)."""

    def node_watch_resources(
        self, request: health.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health.NodeWatchResourcesResponse]: ...


def health_handler(service: HealthService) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        HEALTH_SERVICE,
        {
            WATCH_RESOURCES: grpc.unary_stream_rpc_method_handler(
                service.node_watch_resources,
                request_deserializer=_deserializer(health.NodeWatchResourcesRequest),
                response_serializer=_serialize,
            ),
        },
    )


def registration_handler(service: RegistrationService) -> grpc.GenericRpcHandler:
    unary = grpc.unary_unary_rpc_method_handler
    return grpc.method_handlers_generic_handler(
        REGISTRATION_SERVICE,
        {
            GET_INFO: unary(
                service.get_info,
                request_deserializer=_deserializer(reg.InfoRequest),
                response_serializer=_serialize,
            ),
            NOTIFY: unary(
                service.notify_registration_status,
                request_deserializer=_deserializer(reg.RegistrationStatus),
                response_serializer=_serialize,
            ),
        },
    )


# -- client side (the kubelet's; used by the emulator and tests) ---------------------------


class RegistrationClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        path = REGISTRATION_SERVICE
        self._info = channel.unary_unary(
            method_path(path, GET_INFO),
            request_serializer=_serialize,
            response_deserializer=reg.PluginInfo.FromString,
        )
        self._notify = channel.unary_unary(
            method_path(path, NOTIFY),
            request_serializer=_serialize,
            response_deserializer=reg.RegistrationStatusResponse.FromString,
        )

    async def get_info(self, *, timeout_s: float) -> reg.PluginInfo:
        info: reg.PluginInfo = await self._info(reg.InfoRequest(), timeout=timeout_s)
        return info

    async def notify(self, registered: bool, error: str, *, timeout_s: float) -> None:
        status = reg.RegistrationStatus(plugin_registered=registered, error=error)
        await self._notify(status, timeout=timeout_s)


class DraClientV1:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._prepare = channel.unary_unary(
            method_path(V1_SERVICE, PREPARE),
            request_serializer=_serialize,
            response_deserializer=v1.NodePrepareResourcesResponse.FromString,
        )
        self._unprepare = channel.unary_unary(
            method_path(V1_SERVICE, UNPREPARE),
            request_serializer=_serialize,
            response_deserializer=v1.NodeUnprepareResourcesResponse.FromString,
        )

    async def prepare(
        self, request: v1.NodePrepareResourcesRequest, *, timeout_s: float
    ) -> v1.NodePrepareResourcesResponse:
        response: v1.NodePrepareResourcesResponse = await self._prepare(request, timeout=timeout_s)
        return response

    async def unprepare(
        self, request: v1.NodeUnprepareResourcesRequest, *, timeout_s: float
    ) -> v1.NodeUnprepareResourcesResponse:
        response: v1.NodeUnprepareResourcesResponse = await self._unprepare(
            request, timeout=timeout_s
        )
        return response


class DraClientV1beta1:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._prepare = channel.unary_unary(
            method_path(V1BETA1_SERVICE, PREPARE),
            request_serializer=_serialize,
            response_deserializer=v1beta1.NodePrepareResourcesResponse.FromString,
        )
        self._unprepare = channel.unary_unary(
            method_path(V1BETA1_SERVICE, UNPREPARE),
            request_serializer=_serialize,
            response_deserializer=v1beta1.NodeUnprepareResourcesResponse.FromString,
        )

    async def prepare(
        self, request: v1beta1.NodePrepareResourcesRequest, *, timeout_s: float
    ) -> v1beta1.NodePrepareResourcesResponse:
        response: v1beta1.NodePrepareResourcesResponse = await self._prepare(
            request, timeout=timeout_s
        )
        return response

    async def unprepare(
        self, request: v1beta1.NodeUnprepareResourcesRequest, *, timeout_s: float
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response: v1beta1.NodeUnprepareResourcesResponse = await self._unprepare(
            request, timeout=timeout_s
        )
        return response


class DraHealthClient:
    """The kubelet's side of `NodeWatchResources`."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._watch = channel.unary_stream(
            method_path(HEALTH_SERVICE, WATCH_RESOURCES),
            request_serializer=_serialize,
            response_deserializer=health.NodeWatchResourcesResponse.FromString,
        )

    async def watch(self) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        """Every response of one stream, until the plugin ends it (or raises its error)."""
        call = self._watch(health.NodeWatchResourcesRequest())
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()
