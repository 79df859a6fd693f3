"""The only place PodResources protobuf messages meet `ports.ContainerDevices`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.podresources.claims import ContainerClaim, claim_device_id, claim_resource
from gpuslice.ports import ContainerDevices
from gpuslice.protos.podresources.v1 import api_pb2 as pb

LIST_METHOD = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD = "/v1.PodResourcesLister/GetAllocatableResources"
GET_METHOD = "/v1.PodResourcesLister/Get"
SERVICE = "v1.PodResourcesLister"


def pod_resources(
    assignments: Iterable[ContainerDevices], claims: Iterable[ContainerClaim] = ()
) -> list[pb.PodResources]:
    """Group flat assignments and claim uses into the kubelet's pod -> container nesting
    (devices in `devices`, claims in `dynamic_resources`)."""
    pods: dict[tuple[str, str], dict[str, _Container]] = {}

    def container_of(namespace: str, pod: str, container: str) -> _Container:
        containers = pods.setdefault((namespace, pod), {})
        return containers.setdefault(container, _Container({}, []))

    for a in assignments:
        held = container_of(a.namespace, a.pod, a.container)
        held.devices.setdefault(a.resource, []).extend(a.device_ids)
    for c in claims:
        container_of(c.namespace, c.pod, c.container).claims.append(c)
    return [
        pb.PodResources(
            name=pod,
            namespace=namespace,
            containers=[
                pb.ContainerResources(
                    name=container,
                    devices=[
                        pb.ContainerDevices(resource_name=r, device_ids=ids)
                        for r, ids in held.devices.items()
                    ],
                    dynamic_resources=[_dynamic_resource(c) for c in held.claims],
                )
                for container, held in containers.items()
            ],
        )
        for (namespace, pod), containers in pods.items()
    ]


def assignments_of(
    pods: Iterable[pb.PodResources], dra_driver: str | None = None
) -> tuple[ContainerDevices, ...]:
    """Flatten; containers without devices (most of them, on a real node) are dropped.

    DRA claims (`dynamic_resources`) become `ContainerDevices(resource="claim:<ns>/<name>",
    device_ids=("<pool>/<device>[/<shareID>]", ...))`; with `dra_driver`, only that
    driver's devices count (a claim may also hold other drivers' NICs or FPGAs), and a
    claim left with none is dropped.
    """
    out: list[ContainerDevices] = []
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                if devices.device_ids:
                    out.append(
                        ContainerDevices(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=devices.resource_name,
                            device_ids=tuple(devices.device_ids),
                        )
                    )
            for dynamic in container.dynamic_resources:
                ids = tuple(
                    claim_device_id(
                        r.pool_name, r.device_name, r.share_id if r.HasField("share_id") else None
                    )
                    for r in dynamic.claim_resources
                    if dra_driver is None or r.driver_name == dra_driver
                )
                if ids:
                    out.append(
                        ContainerDevices(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=claim_resource(dynamic.claim_namespace, dynamic.claim_name),
                            device_ids=ids,
                        )
                    )
    return tuple(out)


@dataclass(slots=True)
class _Container:
    devices: dict[str, list[str]]
    claims: list[ContainerClaim]


def _dynamic_resource(c: ContainerClaim) -> pb.DynamicResource:
    resources = []
    for d in c.devices:
        r = pb.ClaimResource(
            cdi_devices=[pb.CDIDevice(name=n) for n in d.cdi_ids],
            driver_name=d.driver,
            pool_name=d.pool,
            device_name=d.device,
        )
        if d.share_id is not None:
            r.share_id = d.share_id
        resources.append(r)
    return pb.DynamicResource(
        claim_name=c.claim_name, claim_namespace=c.claim_namespace, claim_resources=resources
    )


def allocatable_response(devices: Mapping[str, Sequence[str]]) -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(
        devices=[
            pb.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in devices.items()
        ]
    )


def allocatable_of(resp: pb.AllocatableResourcesResponse) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for devices in resp.devices:
        out.setdefault(devices.resource_name, []).extend(devices.device_ids)
    return {r: tuple(ids) for r, ids in out.items()}
