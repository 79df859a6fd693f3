"""Checks an Allocate request against the plan before any response is built.

The error texts keep NVIDIA's wording (`invalid allocation request for "<res>": invalid
request: ...`) because kubelet events, runbooks and alerts match on them; where NVIDIA's
text leaves the user guessing, a hint follows as a separate sentence so the original prefix
still matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuslice.core.errors import AllocationError
from gpuslice.core.sharing.model import AdvertisedDevice, ResourcePlan
from gpuslice.core.text import shown


def device_lookup(resource: ResourcePlan) -> dict[str, AdvertisedDevice]:
    """Advertised ID -> device. Built per call: a dict over 8,192 devices costs ~1 ms."""
    return {dev.id: dev for dev in resource.devices}


def request_error(resource: ResourcePlan, detail: str) -> AllocationError:
    return AllocationError(
        f'invalid allocation request for "{resource.name}": invalid request: {detail}'
    )


def _too_many_hint(resource: ResourcePlan, found: int) -> str:
    return (
        f"Each container may request only 1 device of {resource.name}, because every one is a "
        f"share of a GPU; request {resource.name}: 1 instead of {found}, or set "
        "failRequestsGreaterThanOne: false for this resource in the sharing config (several "
        "shares then still run on the same GPU), or request a whole-GPU resource."
    )


def validate_request(
    resource: ResourcePlan,
    device_ids: Sequence[str],
    lookup: Mapping[str, AdvertisedDevice] | None = None,
) -> tuple[AdvertisedDevice, ...]:
    """The advertised devices behind `device_ids`, in request order; AllocationError if invalid.

    Order of checks follows NVIDIA (unknown IDs first, then the size rule for shared
    resources), so the same bad request gets the same first error. A repeated ID is granted
    once, as NVIDIA's Allocate does (`internal/plugin/server.go`, "Deduplicate requested
    device IDs", v0.18.0), rather than refused.
    """
    devices = device_lookup(resource) if lookup is None else lookup
    if not device_ids:
        raise request_error(resource, "no devices requested")
    found: list[AdvertisedDevice] = []
    seen: set[str] = set()
    for device_id in device_ids:
        dev = devices.get(device_id)
        if dev is None:
            raise request_error(resource, f"unknown device: {shown(device_id)}")
        if device_id in seen:
            continue  # NVIDIA de-duplicates requested IDs and grants the rest (v0.18.0)
        seen.add(device_id)
        found.append(dev)
    shared = any(dev.replica is not None for dev in found)
    if shared and len(found) > 1 and resource.fail_requests_greater_than_one:
        n = len(found)
        raise AllocationError(
            f'invalid allocation request for "{resource.name}": invalid request: maximum '
            f"request size for shared resources is 1; found {n}. {_too_many_hint(resource, n)}"
        )
    return tuple(found)
