"""What the emulated kubelet hands a pod: its devices and the plugin's Allocate answers.

The answers are kept as core data (`ContainerAllocation`), decoded from the wire, so a test
or the demo can compare what reached the "kubelet" with what the core built.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.core.allocation.response import ContainerAllocation, DeviceSpec, Mount


class AdmissionError(Exception):
    """The kubelet refused a pod (UnexpectedAdmissionError); the text is the kubelet's."""


@dataclass(frozen=True, slots=True)
class ResourceAllocation:
    """One resource of one container: the IDs the kubelet chose and the plugin's answer."""

    resource: str
    device_ids: tuple[str, ...]
    response: ContainerAllocation


@dataclass(frozen=True, slots=True)
class ContainerAdmission:
    name: str
    allocations: tuple[ResourceAllocation, ...]

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(i for a in self.allocations for i in a.device_ids)

    @property
    def envs(self) -> dict[str, str]:
        """All resources' env vars, as the runtime would merge them (later ones win)."""
        return {k: v for a in self.allocations for k, v in a.response.envs}

    @property
    def mounts(self) -> tuple[Mount, ...]:
        return tuple(m for a in self.allocations for m in a.response.mounts)

    @property
    def devices(self) -> tuple[DeviceSpec, ...]:
        return tuple(d for a in self.allocations for d in a.response.devices)

    @property
    def annotations(self) -> dict[str, str]:
        return {k: v for a in self.allocations for k, v in a.response.annotations}

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        return tuple(n for a in self.allocations for n in a.response.cdi_devices)

    def for_resource(self, resource: str) -> ResourceAllocation | None:
        for a in self.allocations:
            if a.resource == resource:
                return a
        return None


@dataclass(frozen=True, slots=True)
class Admission:
    namespace: str
    pod: str
    containers: tuple[ContainerAdmission, ...]

    def container(self, name: str) -> ContainerAdmission:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(name)


def unavailable(resource: str, requested: int, available: int) -> AdmissionError:
    return AdmissionError(
        f"Allocate failed due to requested number of devices unavailable for {resource}. "
        f"Requested: {requested}, Available: {available}, which is unexpected"
    )


def rpc_failed(code_name: str, details: str) -> AdmissionError:
    """`code_name` as gRPC's enum name (`UNKNOWN`); the kubelet prints Go's form (`Unknown`)."""
    go_code = "".join(part.capitalize() for part in code_name.split("_"))
    return AdmissionError(
        f"Allocate failed due to rpc error: code = {go_code} desc = {details}, which is unexpected"
    )
