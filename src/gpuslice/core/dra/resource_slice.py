"""The parts of a stored `resource.k8s.io/v1` ResourceSlice that the publisher reads, typed
once: its name, resourceVersion, spec and pool generation, and of its devices what the
API server may have dropped. Reading never raises (a slice of the wrong shape reads as
nameless, without generation or devices), since what the API holds is compared with what
this node wants, and a damaged slice is simply one that differs and is rewritten."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredSlice:
    name: str
    """`metadata.name` ("" when missing)."""
    resource_version: str
    """`metadata.resourceVersion` ("" when missing): with the name, what tells a slice the
    API server rewrote from the one already seen."""
    spec: object
    """`spec` as stored, compared whole with the wanted one."""
    generation: int | None
    """`spec.pool.generation`; None when missing or not a whole number."""
    obj: Mapping[str, Any]
    """The object as read: an update sends it back with the new spec (`resourceVersion`
    kept, so a concurrent writer's change is not overwritten)."""

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> StoredSlice:
        metadata = _mapping(obj.get("metadata"))
        spec = obj.get("spec")
        return cls(
            str(metadata.get("name") or ""),
            str(metadata.get("resourceVersion") or ""),
            spec,
            _generation(spec),
            obj,
        )


@dataclass(frozen=True, slots=True)
class StoredDevice:
    """A device of a stored slice, as far as the publisher checks what the API server kept
    of it: a server without a feature gate drops the fields of that feature."""

    name: str | None
    """`name`, None when missing (the log says so)."""
    partition: bool
    """A dynamic MIG partition as published: a MIG device without a `uuid` attribute."""
    consumes_counters: bool
    """`consumesCounters` kept (DRAPartitionableDevices)."""
    offers_shares: bool
    """`capacity.shares` published."""
    multiple_allocations: bool
    """`allowMultipleAllocations` kept and true (DRAConsumableCapacity)."""

    @classmethod
    def read(cls, device: object) -> StoredDevice:
        d = _mapping(device)
        attributes = _mapping(d.get("attributes"))
        kind = _mapping(attributes.get("type")).get("string")
        name = d.get("name")
        return cls(
            name=None if name is None else str(name),
            partition=kind == "mig" and "uuid" not in attributes,
            consumes_counters="consumesCounters" in d,
            offers_shares="shares" in _mapping(d.get("capacity")),
            multiple_allocations=bool(d.get("allowMultipleAllocations")),
        )


def stored_devices(obj: Mapping[str, Any]) -> tuple[StoredDevice, ...]:
    """`spec.devices` of a stored slice; none when the spec or its devices are missing."""
    devices = _mapping(obj.get("spec")).get("devices")
    if not isinstance(devices, list):
        return ()
    return tuple(StoredDevice.read(d) for d in devices)


def _mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is an object, else an empty one: a missing, null or misshapen field
    reads as one without fields."""
    return value if isinstance(value, Mapping) else {}


def _generation(spec: object) -> int | None:
    value = _mapping(_mapping(spec).get("pool")).get("generation")
    if not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None
