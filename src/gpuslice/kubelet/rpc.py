"""The v1beta1 services' gRPC plumbing, written by hand instead of a generated `_pb2_grpc`.

Generic handlers and explicit (de)serializers keep every call typed under mypy --strict
and keep the method names in one place. ListAndWatch responses travel pre-serialized
(`bytes`): a device list is encoded once per plan version and the same bytes go to every
stream, which is what keeps the 8,192-device case cheap.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api

VERSION = "v1beta1"
"""The only device plugin API version the kubelet supports."""

REGISTER = "/v1beta1.Registration/Register"
GET_DEVICE_PLUGIN_OPTIONS = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
LIST_AND_WATCH = "/v1beta1.DevicePlugin/ListAndWatch"
GET_PREFERRED_ALLOCATION = "/v1beta1.DevicePlugin/GetPreferredAllocation"
ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
PRE_START_CONTAINER = "/v1beta1.DevicePlugin/PreStartContainer"

M = TypeVar("M", bound=Message)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _deserializer(cls: type[M]) -> Callable[[bytes], M]:
    def parse(data: bytes) -> M:
        return cls.FromString(data)

    return parse


def _identity(data: bytes) -> bytes:
    return data


def unix_target(path: str) -> str:
    """gRPC's name for a unix socket path (absolute paths give `unix:///...`)."""
    return f"unix:{path}"


# -- server side ---------------------------------------------------------------------------


class DevicePluginService(Protocol):
    """What one device plugin server answers. `context` is a `grpc.aio.ServicerContext`."""

    async def get_device_plugin_options(
        self, request: api.Empty, context: grpc.aio.ServicerContext
    ) -> api.DevicePluginOptions: ...

    def list_and_watch(
        self, request: api.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Yields serialized `ListAndWatchResponse`s."""
        ...

    async def get_preferred_allocation(
        self, request: api.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api.PreferredAllocationResponse: ...

    async def allocate(
        self, request: api.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api.AllocateResponse: ...

    async def pre_start_container(
        self, request: api.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api.PreStartContainerResponse: ...


class RegistrationService(Protocol):
    """The kubelet's side: what the emulator answers on kubelet.sock.

    It receives the serialized `RegisterRequest` as sent, so the emulator can keep the exact
    bytes for wire-format checks; `api.RegisterRequest.FromString` decodes it.
    """

    async def register(self, request: bytes, context: grpc.aio.ServicerContext) -> api.Empty: ...


def device_plugin_handler(service: DevicePluginService) -> grpc.GenericRpcHandler:
    unary = grpc.unary_unary_rpc_method_handler
    return grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {
            "GetDevicePluginOptions": unary(
                service.get_device_plugin_options,
                request_deserializer=_deserializer(api.Empty),
                response_serializer=_serialize,
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                service.list_and_watch,
                request_deserializer=_deserializer(api.Empty),
                response_serializer=_identity,
            ),
            "GetPreferredAllocation": unary(
                service.get_preferred_allocation,
                request_deserializer=_deserializer(api.PreferredAllocationRequest),
                response_serializer=_serialize,
            ),
            "Allocate": unary(
                service.allocate,
                request_deserializer=_deserializer(api.AllocateRequest),
                response_serializer=_serialize,
            ),
            "PreStartContainer": unary(
                service.pre_start_container,
                request_deserializer=_deserializer(api.PreStartContainerRequest),
                response_serializer=_serialize,
            ),
        },
    )


def registration_handler(service: RegistrationService) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "v1beta1.Registration",
        {
            "Register": grpc.unary_unary_rpc_method_handler(
                service.register,
                request_deserializer=_identity,
                response_serializer=_serialize,
            )
        },
    )


# -- client side ---------------------------------------------------------------------------


class RegistrationClient:
    """Calls the kubelet's Registration service over an open channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._register = channel.unary_unary(
            REGISTER, request_serializer=_serialize, response_deserializer=api.Empty.FromString
        )

    async def register(self, request: api.RegisterRequest, *, timeout_s: float) -> None:
        await self._register(request, timeout=timeout_s)


class DevicePluginClient:
    """Calls one device plugin the way the kubelet does (used by the emulator and tests)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._options = channel.unary_unary(
            GET_DEVICE_PLUGIN_OPTIONS,
            request_serializer=_serialize,
            response_deserializer=api.DevicePluginOptions.FromString,
        )
        self._list_and_watch = channel.unary_stream(
            LIST_AND_WATCH,
            request_serializer=_serialize,
            response_deserializer=api.ListAndWatchResponse.FromString,
        )
        self._preferred = channel.unary_unary(
            GET_PREFERRED_ALLOCATION,
            request_serializer=_serialize,
            response_deserializer=api.PreferredAllocationResponse.FromString,
        )
        self._allocate = channel.unary_unary(
            ALLOCATE,
            request_serializer=_serialize,
            response_deserializer=api.AllocateResponse.FromString,
        )
        self._pre_start = channel.unary_unary(
            PRE_START_CONTAINER,
            request_serializer=_serialize,
            response_deserializer=api.PreStartContainerResponse.FromString,
        )

    async def get_device_plugin_options(self, *, timeout_s: float) -> api.DevicePluginOptions:
        response: api.DevicePluginOptions = await self._options(api.Empty(), timeout=timeout_s)
        return response

    async def list_and_watch(self) -> AsyncGenerator[api.ListAndWatchResponse, None]:
        """Yields each device list the plugin sends until the stream ends.

        Raises `grpc.aio.AioRpcError` if the stream fails; a stream the server ends is a
        normal end of iteration.
        """
        call = self._list_and_watch(api.Empty())
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    async def get_preferred_allocation(
        self, request: api.PreferredAllocationRequest, *, timeout_s: float
    ) -> api.PreferredAllocationResponse:
        response: api.PreferredAllocationResponse = await self._preferred(
            request, timeout=timeout_s
        )
        return response

    async def allocate(
        self, request: api.AllocateRequest, *, timeout_s: float
    ) -> api.AllocateResponse:
        response: api.AllocateResponse = await self._allocate(request, timeout=timeout_s)
        return response

    async def pre_start_container(
        self, request: api.PreStartContainerRequest, *, timeout_s: float
    ) -> api.PreStartContainerResponse:
        response: api.PreStartContainerResponse = await self._pre_start(request, timeout=timeout_s)
        return response
