"""What the kubelet and a DRA driver exchange per claim, as plain data.

The gRPC adapter (`gpuslice.dra`) turns these into the v1 or v1beta1 messages and back, so
the driver's preparation logic never sees protobuf and the same answer serves both API
versions (v1beta1 just cannot carry `share_id`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it; the driver reads the rest from the API."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a prepared claim and the CDI devices that give access to it."""

    request_names: tuple[str, ...]
    """Requests of the claim the device serves; empty means all of them."""
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    """Fully qualified CDI names (`vendor/class=name`) the runtime injects."""
    share_id: str | None = None
    """The allocation's shareID for a consumable-capacity device (v1 only)."""


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """One claim's answer: its devices, or a non-empty `error` (devices then ignored)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
