"""Which devices are healthy, from the backend's health events.

Three deliberate differences from NVIDIA's plugin, each fixing a reported problem:

* every replica of a sick device turns Unhealthy, not only the last one
  (NVIDIA/k8s-device-plugin#1929, closed upstream in 2026-09);
* a `recovered` event makes devices Healthy again (NVIDIA needs a plugin restart);
* an XID attributed to one MIG instance marks only that MIG device, never its siblings.

An ignored XID is still remembered (`HealthState.noticed`): DRA mode publishes it as NVIDIA's
DRA driver does, an informational taint that leaves the device in service.

A GPU whose health events could not be registered (`HealthState.unmonitored`) is not
silently taken for healthy: each front end does what NVIDIA's does in its mode (the device
plugin lists it Unhealthy, `state.Snapshot.out_of_service`; the DRA driver taints it
`unmonitored`, effect `None`, and reports its health Unknown).

The env-var rules (`DP_DISABLE_HEALTHCHECKS`, `DP_ENABLE_HEALTHCHECKS`) are NVIDIA's, so
existing DaemonSet settings keep their meaning. Parsing returns warnings instead of logging
them: the core does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from gpuslice.core.devices import Gpu, Inventory
from gpuslice.core.sharing.model import AdvertisedDevice

HealthEventKind = Literal[
    "xid", "recovered", "lost", "inventory-changed", "unmonitored", "unsupported"
]

NO_INSTANCE = 0xFFFFFFFF
"""NVML's marker for "not attributable to a MIG GPU/compute instance"."""


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something the backend observed about one GPU's health.

    `xid` events carry the XID number; under MIG, `gi_id`/`ci_id` say which instance the
    error belongs to, or are None when NVML could not attribute it (the whole GPU then).
    `recovered` says the device answers normally again (NVIDIA never recovers; we do).
    `lost` is a device that stopped answering at all. `inventory-changed` is not about
    health: the GPU's MIG mode or layout changed (NVML's MIG config change event), and the
    agent re-plans now instead of at its next periodic inventory read.
    `unmonitored`: the GPU's health events could not be registered (NVML refused), so no
    XID on it will ever be seen; `unsupported`: NVML says the GPU does not support them (too
    old), or health events could not be set up at all. `reason` says why, for the log.
    """

    kind: HealthEventKind
    gpu_uuid: str
    xid: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unmonitored:
    """Why a GPU's health is not watched (`HealthEvent` kinds `unmonitored`, `unsupported`).

    NVIDIA's device plugin lists a GPU whose event registration failed Unhealthy, but keeps
    one NVML calls too old for the events (or every GPU, when the event set itself cannot
    be made: its health checks are then off) in service; NVIDIA's DRA driver taints all of
    them `unmonitored` with effect `None`. `in_service` carries that difference.
    """

    reason: str
    in_service: bool


DeviceHealth = Literal["Healthy", "Unhealthy"]

DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
"""Application-caused XIDs NVIDIA ignores by default: they say nothing about the GPU."""

_ALL_WORDS = frozenset({"all", "xids"})


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Which XIDs count, after both env vars are applied."""

    ignored: frozenset[int] = DEFAULT_IGNORED_XIDS
    """XIDs that do not mark a device unhealthy (defaults plus DP_DISABLE_HEALTHCHECKS)."""
    disable_all: bool = False
    """DP_DISABLE_HEALTHCHECKS contained `all` or `xids`."""
    enabled: frozenset[int] = frozenset()
    """DP_ENABLE_HEALTHCHECKS numbers: always count, whatever else says."""
    enable_all: bool = False
    """DP_ENABLE_HEALTHCHECKS contained `all` (or `xids`): every XID counts."""

    @classmethod
    def from_env(
        cls, disable: str | None, enable: str | None
    ) -> tuple[HealthPolicy, tuple[str, ...]]:
        """Parse the two env vars (comma lists, case-insensitive); malformed entries -> warnings."""
        warnings: list[str] = []
        disable_all, disabled = _parse("DP_DISABLE_HEALTHCHECKS", disable, warnings)
        enable_all, enabled = _parse("DP_ENABLE_HEALTHCHECKS", enable, warnings)
        policy = cls(
            ignored=DEFAULT_IGNORED_XIDS | disabled,
            disable_all=disable_all,
            enabled=enabled,
            enable_all=enable_all,
        )
        return policy, tuple(warnings)

    @property
    def checking_disabled(self) -> bool:
        """Health checking is off entirely: `all` disabled and nothing re-enabled."""
        return self.disable_all and not self.enable_all and not self.enabled

    def counts(self, xid: int | None) -> bool:
        """Whether this XID marks a device unhealthy. An XID the backend could not read counts."""
        if self.enable_all or (xid is not None and xid in self.enabled):
            return True
        if self.disable_all:
            return False
        return xid is None or xid not in self.ignored

    def affected(self, event: HealthEvent, inventory: Inventory) -> frozenset[str]:
        """The physical UUIDs (GPU and/or MIG) the event makes unhealthy, or healthy again.

        `xid`: ignored XIDs and unknown GPUs affect nothing. On a GPU with MIG devices an
        event with a GPU instance (and compute instance) marks only the matching MIG devices;
        one NVML could not attribute marks the GPU and all of its MIG devices. `lost` and
        `recovered` always cover the GPU and all of its MIG devices. With checking disabled
        entirely (`DP_DISABLE_HEALTHCHECKS=all`) nothing is ever marked.
        """
        if self.checking_disabled and event.kind != "recovered":
            return frozenset()
        if event.kind not in ("xid", "lost", "recovered"):
            return frozenset()  # not a verdict on the device (`HealthState.unmonitored`)
        gpu = inventory.gpu_by_uuid(event.gpu_uuid)
        if event.kind in ("lost", "recovered"):
            whole = _whole(gpu) if gpu is not None else frozenset()
            return whole | {event.gpu_uuid}
        if gpu is None or not self.counts(event.xid):
            return frozenset()
        return _placement(event, gpu)

    def noticed(self, event: HealthEvent, inventory: Inventory) -> frozenset[str]:
        """The devices an XID that does *not* count is about (an ignored, application-caused
        XID): NVIDIA's DRA driver publishes these as informational taints (effect `None`),
        so an operator sees them on the device without the device leaving service. Nothing
        with checking disabled entirely, as NVIDIA's driver without its health monitor."""
        if event.kind != "xid" or self.checking_disabled or self.counts(event.xid):
            return frozenset()
        gpu = inventory.gpu_by_uuid(event.gpu_uuid)
        return frozenset() if gpu is None else _placement(event, gpu)


def _placement(event: HealthEvent, gpu: Gpu) -> frozenset[str]:
    """The GPU and its MIG devices, or the MIG devices the event's instances name."""
    gi = None if event.gi_id == NO_INSTANCE else event.gi_id
    ci = None if event.ci_id == NO_INSTANCE else event.ci_id
    if not gpu.mig_devices or gi is None:
        return _whole(gpu)
    return frozenset(
        m.uuid for m in gpu.mig_devices if m.gi_id == gi and (ci is None or m.ci_id == ci)
    )


def _whole(gpu: Gpu) -> frozenset[str]:
    return frozenset({gpu.uuid, *(m.uuid for m in gpu.mig_devices)})


def _parse(name: str, value: str | None, warnings: list[str]) -> tuple[bool, frozenset[int]]:
    everything = False
    xids: set[int] = set()
    for raw in (value or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry in _ALL_WORDS:
            everything = True
        elif entry.isdigit():
            xids.add(int(entry))
        else:
            warnings.append(
                f'{name}: ignoring "{raw.strip()}": expected "all", "xids" or an XID number '
                "(e.g. 79), comma-separated"
            )
    return everything, frozenset(xids)


@dataclass(frozen=True, slots=True)
class HealthState:
    """The physical devices (GPU and MIG UUIDs) currently unhealthy, and those that had an
    ignored XID (`noticed`: UUID -> the last such XID), which stay in service."""

    unhealthy: frozenset[str] = field(default_factory=frozenset)
    noticed: Mapping[str, int] = field(default_factory=dict)
    unmonitored: Mapping[str, Unmonitored] = field(default_factory=dict)
    """GPU UUID -> why its health events are not watched. Kept for the agent's life: events
    are registered once, at start, so nothing (not even `recovered`) makes it watched."""

    def apply(self, event: HealthEvent, inventory: Inventory, policy: HealthPolicy) -> HealthState:
        if event.kind == "inventory-changed":
            return self  # not a health change: the agent re-plans instead
        if event.kind in ("unmonitored", "unsupported"):
            if policy.checking_disabled:  # no health checks asked for: nothing is missing
                return self
            unmonitored = dict(self.unmonitored)
            unmonitored[event.gpu_uuid] = Unmonitored(
                event.reason, in_service=event.kind == "unsupported"
            )
            return replace(self, unmonitored=unmonitored)
        affected = policy.affected(event, inventory)
        if event.kind == "recovered":
            noticed = {u: x for u, x in self.noticed.items() if u not in affected}
            return HealthState(self.unhealthy - affected, noticed, self.unmonitored)
        noticed = dict(self.noticed)
        if event.xid is not None:
            noticed.update(dict.fromkeys(policy.noticed(event, inventory), event.xid))
        return HealthState(self.unhealthy | affected, noticed, self.unmonitored)


def device_health(dev: AdvertisedDevice, unhealthy: frozenset[str]) -> DeviceHealth:
    """Every replica of a sick device is sick: its physical device or parent GPU decides."""
    if dev.physical.uuid in unhealthy or dev.physical.gpu_uuid in unhealthy:
        return "Unhealthy"
    return "Healthy"
