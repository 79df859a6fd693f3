"""The one place where core data meets protobuf.

Core modules build plain frozen data (the plan, `ContainerAllocation`); this module turns it
into the kubelet's v1beta1 messages, and back again for the kubelet emulator, so "what goes
on the wire?" has a one-step answer and the core never sees a generated class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuslice.core.allocation.response import ContainerAllocation, DeviceSpec, Mount
from gpuslice.core.health import device_health
from gpuslice.core.sharing.model import ResourcePlan
from gpuslice.kubelet.rpc import VERSION
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api


def plugin_options() -> api.DevicePluginOptions:
    """What every gpuslice plugin supports: preferred allocation, no PreStartContainer."""
    return api.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


def register_request(resource_name: str, endpoint: str) -> api.RegisterRequest:
    return api.RegisterRequest(
        version=VERSION, endpoint=endpoint, resource_name=resource_name, options=plugin_options()
    )


def device_list(resource: ResourcePlan, unhealthy: frozenset[str]) -> api.ListAndWatchResponse:
    """The full ListAndWatch message for one resource (the kubelet wants the whole list)."""
    topologies: dict[int, api.TopologyInfo] = {}
    devices = []
    for dev in resource.devices:
        numa = dev.physical.numa_node
        msg = api.Device(ID=dev.id, health=device_health(dev, unhealthy))
        if numa is not None and numa >= 0:
            topo = topologies.get(numa)
            if topo is None:
                topo = topologies[numa] = api.TopologyInfo(nodes=[api.NUMANode(ID=numa)])
            msg.topology.CopyFrom(topo)
        devices.append(msg)
    return api.ListAndWatchResponse(devices=devices)


def allocation_to_proto(alloc: ContainerAllocation) -> api.ContainerAllocateResponse:
    return api.ContainerAllocateResponse(
        envs=dict(alloc.envs),
        mounts=[
            api.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in alloc.mounts
        ],
        devices=[
            api.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in alloc.devices
        ],
        annotations=dict(alloc.annotations),
        cdi_devices=[api.CDIDevice(name=n) for n in alloc.cdi_devices],
    )


def allocation_from_proto(msg: api.ContainerAllocateResponse) -> ContainerAllocation:
    """What the kubelet received, as core data again (the emulator keeps it like this)."""
    return ContainerAllocation(
        envs=tuple(sorted(msg.envs.items())),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in msg.mounts),
        devices=tuple(
            DeviceSpec(d.container_path, d.host_path, d.permissions) for d in msg.devices
        ),
        annotations=tuple(sorted(msg.annotations.items())),
        cdi_devices=tuple(c.name for c in msg.cdi_devices),
    )


def preferred_request(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> api.PreferredAllocationRequest:
    return api.PreferredAllocationRequest(
        container_requests=[
            api.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available),
                must_include_deviceIDs=list(must_include),
                allocation_size=size,
            )
        ]
    )


def allocate_request(device_ids: Iterable[str]) -> api.AllocateRequest:
    return api.AllocateRequest(
        container_requests=[api.ContainerAllocateRequest(devices_ids=list(device_ids))]
    )
