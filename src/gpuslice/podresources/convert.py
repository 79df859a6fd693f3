"""The only place PodResources protobuf messages meet `ports.ContainerDevices`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuslice.kubelet.protos.podresources.v1 import api_pb2 as pb
from gpuslice.ports import ContainerDevices

LIST_METHOD = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD = "/v1.PodResourcesLister/GetAllocatableResources"
GET_METHOD = "/v1.PodResourcesLister/Get"
SERVICE = "v1.PodResourcesLister"


def pod_resources(assignments: Iterable[ContainerDevices]) -> list[pb.PodResources]:
    """Group flat assignments into the kubelet's pod -> container -> devices nesting."""
    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    for a in assignments:
        containers = pods.setdefault((a.namespace, a.pod), {})
        resources = containers.setdefault(a.container, {})
        resources.setdefault(a.resource, []).extend(a.device_ids)
    return [
        pb.PodResources(
            name=pod,
            namespace=namespace,
            containers=[
                pb.ContainerResources(
                    name=container,
                    devices=[
                        pb.ContainerDevices(resource_name=r, device_ids=ids)
                        for r, ids in resources.items()
                    ],
                )
                for container, resources in containers.items()
            ],
        )
        for (namespace, pod), containers in pods.items()
    ]


def assignments_of(pods: Iterable[pb.PodResources]) -> tuple[ContainerDevices, ...]:
    """Flatten; containers without devices (most of them, on a real node) are dropped."""
    return tuple(
        ContainerDevices(
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            resource=devices.resource_name,
            device_ids=tuple(devices.device_ids),
        )
        for pod in pods
        for container in pod.containers
        for devices in container.devices
        if devices.device_ids
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
