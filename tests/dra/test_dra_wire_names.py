"""The names the kubelet puts on the wire, checked from the generated descriptors and live."""

from __future__ import annotations

import grpc

from gpuslice.dra.convert import claims_to_v1
from gpuslice.dra.rpc import unix_target
from gpuslice.dra.server import DraPluginServer
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.protos.drahealth.v1alpha1 import api_pb2 as health
from gpuslice.protos.pluginregistration.v1 import api_pb2 as reg
from tests.dra.dra_doubles import claim


def _methods(module: object, service: str) -> set[str]:
    descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    return {f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods}


def test_full_method_names_match_what_the_kubelet_calls() -> None:
    assert _methods(v1, "DRAPlugin") == {
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    }
    assert _methods(v1beta1, "DRAPlugin") == {
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    }
    assert _methods(health, "DRAResourceHealth") == {
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    }
    assert health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods[0].server_streaming
    assert _methods(reg, "Registration") == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }


def test_field_numbers_follow_the_kubelet_api() -> None:
    def numbers(message: type) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]

    assert numbers(v1.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert numbers(v1.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert numbers(v1.NodeUnprepareResourceResponse) == {"error": 1}
    assert numbers(v1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence  # proto3 optional
    assert "share_id" not in numbers(v1beta1.Device)
    assert numbers(reg.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert numbers(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert numbers(health.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert numbers(health.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
    assert dict(health.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


async def test_server_answers_on_the_literal_wire_path(server: DraPluginServer) -> None:
    path = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    async with grpc.aio.insecure_channel(unix_target(str(server.dra_socket))) as channel:
        call = channel.unary_unary(
            path,
            request_serializer=v1.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=v1.NodePrepareResourcesResponse.FromString,
        )
        response = await call(
            v1.NodePrepareResourcesRequest(claims=claims_to_v1([claim("u1")])), timeout=5
        )
    assert list(response.claims) == ["u1"]
    assert response.claims["u1"].devices[0].device_name == "gpu-u1"
