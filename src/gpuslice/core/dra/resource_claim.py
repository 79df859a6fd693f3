"""The parts of a `resource.k8s.io/v1` ResourceClaim that Prepare reads, typed once.

The claim arrives as the API server's JSON. It is read here, at the edge of the core, into
the few fields Prepare uses; everything after (`core.dra.claims`, `core.dra.sharing`)
works on these types and never walks the JSON again. Reading never raises: a field of the
wrong shape reads as absent (a `results` that is not a list as no results, an entry that
is not an object as no entry), and the readers that know what a field is for refuse its
absence with the field named. Values a message quotes as the claim wrote them (the UID, a
config's `source`, its parameters) are kept as read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One entry of `status.allocation.devices.results`."""

    index: int
    """Its position in `results` (messages name it; resolved configs are keyed by it)."""
    request: str = ""
    """`main`, or `main/sub` for a firstAvailable subrequest; "" when absent."""
    driver: str = ""
    pool: str = ""
    device: str = ""
    share_id: str = ""
    """`shareID`: set when the device is allocated as one of its consumable shares."""
    admin_access: bool = False
    consumed_capacity: Mapping[str, Any] = field(default_factory=dict)
    """`consumedCapacity` as written (quantities are read by who knows the device)."""


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """One entry of `status.allocation.devices.config`: an opaque config and the requests it
    names (none: every request)."""

    index: int
    source: object = None
    """`FromClass` or `FromClaim` on a valid claim; kept as written, so a refusal quotes it."""
    requests: tuple[str, ...] | None = ()
    """None: `requests` is there but is not a list of names."""
    driver: object = None
    """`opaque.driver`; None when there is no opaque config."""
    parameters: object = None
    """`opaque.parameters`, read by the config kind that owns its apiVersion and kind."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """`status.allocation.devices`."""

    results: tuple[DeviceResult, ...] | None = None
    """None: `results` is missing or not a list."""
    configs: tuple[DeviceConfig, ...] = ()

    @classmethod
    def read(cls, allocation: object) -> Allocation:
        devices = _object(_object(allocation).get("devices"))
        raw_results = devices.get("results")
        results = None
        if isinstance(raw_results, list):
            results = tuple(
                _result(i, r) for i, r in enumerate(raw_results) if isinstance(r, Mapping)
            )
        raw_configs = devices.get("config")
        configs = tuple(
            _config(i, c)
            for i, c in enumerate(raw_configs if isinstance(raw_configs, list) else ())
        )
        return cls(results, configs)


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    is_object: bool
    """False: the claim read is not a JSON object at all."""
    uid: object = None
    """`metadata.uid` as written (compared with the kubelet's)."""
    namespace: object = None
    name: object = None
    allocation: Allocation | None = None
    """None: `status.allocation` is missing (the claim is not allocated)."""

    @classmethod
    def read(cls, claim: object) -> ResourceClaim:
        if not isinstance(claim, Mapping):
            return cls(is_object=False)
        allocation = _object(claim.get("status")).get("allocation")
        metadata = _object(claim.get("metadata"))
        return cls(
            True,
            metadata.get("uid"),
            metadata.get("namespace"),
            metadata.get("name"),
            Allocation.read(allocation) if isinstance(allocation, Mapping) else None,
        )


def _object(value: object) -> Mapping[str, Any]:
    """A JSON object, or an empty one for anything else (absent, null, a list)."""
    return value if isinstance(value, Mapping) else {}


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _result(index: int, r: Mapping[str, Any]) -> DeviceResult:
    return DeviceResult(
        index,
        request=_text(r, "request"),
        driver=_text(r, "driver"),
        pool=_text(r, "pool"),
        device=_text(r, "device"),
        share_id=_text(r, "shareID"),
        admin_access=r.get("adminAccess") is True,
        consumed_capacity=_object(r.get("consumedCapacity")),
    )


def _config(index: int, c: object) -> DeviceConfig:
    if not isinstance(c, Mapping):
        return DeviceConfig(index)
    requests = c.get("requests")
    names: tuple[str, ...] | None = ()
    if isinstance(requests, list) and all(isinstance(r, str) for r in requests):
        names = tuple(requests)
    elif requests is not None and requests != []:
        names = None
    opaque = _object(c.get("opaque"))
    return DeviceConfig(
        index, c.get("source"), names, opaque.get("driver"), opaque.get("parameters")
    )
