"""Core DRA data to and from the kubelet's v1 and v1beta1 messages.

Both versions carry the same fields except `Device.share_id` (v1 only), so the driver
answers once in core data and this module writes whichever version the kubelet called.
The reverse direction is for the DRA kubelet emulator, which reads answers like the kubelet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuslice.core.dra.kubelet_api import ClaimRef, PreparedDevice, PrepareResult
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1

AnyClaim = v1.Claim | v1beta1.Claim
AnyDevice = v1.Device | v1beta1.Device
AnyPrepareResponse = v1.NodePrepareResourcesResponse | v1beta1.NodePrepareResourcesResponse
AnyUnprepareResponse = v1.NodeUnprepareResourcesResponse | v1beta1.NodeUnprepareResourcesResponse


def claims_from_proto(claims: Iterable[AnyClaim]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def claims_to_v1(claims: Sequence[ClaimRef]) -> list[v1.Claim]:
    return [v1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def claims_to_v1beta1(claims: Sequence[ClaimRef]) -> list[v1beta1.Claim]:
    return [v1beta1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def _device_v1(device: PreparedDevice) -> v1.Device:
    out = v1.Device(
        request_names=device.request_names,
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=device.cdi_ids,
    )
    if device.share_id is not None:
        out.share_id = device.share_id
    return out


def _device_v1beta1(device: PreparedDevice) -> v1beta1.Device:
    return v1beta1.Device(
        request_names=device.request_names,
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=device.cdi_ids,
    )


def prepare_response_v1(results: Mapping[str, PrepareResult]) -> v1.NodePrepareResourcesResponse:
    out = v1.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = out.claims[uid]
        entry.error = result.error
        if not result.error:
            entry.devices.extend(_device_v1(d) for d in result.devices)
    return out


def prepare_response_v1beta1(
    results: Mapping[str, PrepareResult],
) -> v1beta1.NodePrepareResourcesResponse:
    out = v1beta1.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = out.claims[uid]
        entry.error = result.error
        if not result.error:
            entry.devices.extend(_device_v1beta1(d) for d in result.devices)
    return out


def unprepare_response_v1(errors: Mapping[str, str]) -> v1.NodeUnprepareResourcesResponse:
    out = v1.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        out.claims[uid].error = error
    return out


def unprepare_response_v1beta1(
    errors: Mapping[str, str],
) -> v1beta1.NodeUnprepareResourcesResponse:
    out = v1beta1.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        out.claims[uid].error = error
    return out


def _device_from_proto(device: AnyDevice) -> PreparedDevice:
    share_id = (
        device.share_id if isinstance(device, v1.Device) and device.HasField("share_id") else None
    )
    return PreparedDevice(
        request_names=tuple(device.request_names),
        pool=device.pool_name,
        device=device.device_name,
        cdi_ids=tuple(device.cdi_device_ids),
        share_id=share_id,
    )


def prepare_results_from_proto(response: AnyPrepareResponse) -> dict[str, PrepareResult]:
    return {
        uid: PrepareResult(
            devices=tuple(_device_from_proto(d) for d in entry.devices), error=entry.error
        )
        for uid, entry in response.claims.items()
    }


def unprepare_errors_from_proto(response: AnyUnprepareResponse) -> dict[str, str]:
    return {uid: entry.error for uid, entry in response.claims.items()}
