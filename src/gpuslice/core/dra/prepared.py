"""The DRA driver's record of prepared claims, as bytes that survive upgrades and reboots.

The kubelet calls Prepare again after it restarts and only sends namespace, UID and name at
Unprepare, so the driver keeps, per claim, what it returned and what it changed on the node.
NVIDIA's driver crash-loops on its own checkpoint after an upgrade (a new field changed the
checksum, its #1080), after corruption (#1100) and after a reboot (#951). Here:

* the checksum covers the stored `data` object exactly as written, whatever fields it has,
  and a reader ignores fields it does not know, so files written by a newer version read;
* decoding never raises: bad bytes come back as `corrupt` with the reason (the adapter
  moves the file aside and starts empty);
* the node's boot ID is stored; a different one means a reboot: nothing prepared survives
  one (MPS daemons, time-slice settings), so the record is `stale` and dropped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuslice.core.dra.kubelet_api import PreparedDevice

FORMAT = "gpuslice.io/dra-checkpoint"
VERSION = 1
ClaimState = Literal["PrepareStarted", "PrepareCompleted"]


@dataclass(frozen=True, slots=True)
class AppliedSharing:
    """What Prepare changed for one group of devices, so Unprepare can undo it."""

    strategy: str
    gpu_uuids: tuple[str, ...]
    mps_key: str = ""
    """The MPS daemon's key in the daemon manager; empty when no daemon."""
    interval: int | None = None
    """The time-slice interval set, to reset to Default at Unprepare."""
    thread_percentage: int | None = None
    """The daemon's default active thread percentage (to start it again after a restart)."""
    limits_mib: tuple[tuple[int, int], ...] = ()
    """The daemon's (GPU index, MiB) pinned memory limits."""


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """What the claim's pods are entitled to on one device, for attribution and the guard
    (kept so a restarted agent keeps guarding claims prepared before it)."""

    device: str
    physical_uuid: str
    """The GPU's or the MIG device's UUID."""
    strategy: str
    """`none`, `time-slicing` or `mps`."""
    shared_by: int = 1
    """Pods meant to share the device (GuardConfig `sharedBy`), or a share's N."""
    share_id: str | None = None
    entitlement_mib: int | None = None
    """A share's consumed memory, or an MPS pinned limit; None: memory / shared_by."""
    thread_percentage: int | None = None
    admin: bool = False
    """Held through `adminAccess`: not exclusive, and not a tenant for the guard."""


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    applied: tuple[AppliedSharing, ...] = ()
    uses: tuple[DeviceUse, ...] = ()
    guard_mode: str | None = None
    """The claim's GuardConfig `mode` (off, observe, enforce); None: the node's."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    boot_id: str = ""
    claims: Mapping[str, PreparedClaim] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decoded:
    status: Literal["ok", "empty", "stale", "corrupt"]
    checkpoint: Checkpoint
    reason: str = ""


def encode(cp: Checkpoint) -> bytes:
    data = {
        "bootID": cp.boot_id,
        "claims": {uid: _claim_json(c) for uid, c in sorted(cp.claims.items())},
    }
    doc = {"format": FORMAT, "version": VERSION, "checksum": _checksum(data), "data": data}
    # compact: `indent` falls back to the pure-Python encoder, 7x slower at 64 claims, and
    # the file is written twice per Prepare
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def decode(raw: bytes | None, boot_id: str) -> Decoded:
    if raw is None:
        return Decoded("empty", Checkpoint(boot_id))
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return Decoded("corrupt", Checkpoint(boot_id), "not a gpuslice DRA checkpoint")
        data = doc.get("data")
        if not isinstance(data, dict) or doc.get("checksum") != _checksum(data):
            return Decoded("corrupt", Checkpoint(boot_id), "checksum mismatch")
        claims = {str(uid): _claim(uid, c) for uid, c in (data.get("claims") or {}).items()}
        stored_boot = str(data.get("bootID", ""))
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return Decoded("corrupt", Checkpoint(boot_id), f"{type(exc).__name__}: {exc}")
    if boot_id and stored_boot and stored_boot != boot_id:
        return Decoded("stale", Checkpoint(boot_id), f"written before a reboot ({stored_boot})")
    return Decoded("ok", Checkpoint(boot_id, claims))


def _checksum(data: Mapping[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _claim_json(c: PreparedClaim) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": c.namespace, "name": c.name, "state": c.state}
    if c.devices:
        out["devices"] = [_device_json(d) for d in c.devices]
    if c.applied:
        out["applied"] = [_applied_json(a) for a in c.applied]
    if c.uses:
        out["uses"] = [_use_json(u) for u in c.uses]
    if c.guard_mode is not None:
        out["guardMode"] = c.guard_mode
    return out


def _use_json(u: DeviceUse) -> dict[str, Any]:
    out: dict[str, Any] = {
        "device": u.device,
        "physical": u.physical_uuid,
        "strategy": u.strategy,
        "sharedBy": u.shared_by,
    }
    if u.admin:
        out["admin"] = True
    for key, value in (
        ("shareID", u.share_id),
        ("entitlementMiB", u.entitlement_mib),
        ("threadPercentage", u.thread_percentage),
    ):
        if value is not None:
            out[key] = value
    return out


def _use(u: Mapping[str, Any]) -> DeviceUse:
    def optional_int(key: str) -> int | None:
        return None if u.get(key) is None else int(u[key])

    return DeviceUse(
        device=str(u["device"]),
        physical_uuid=str(u["physical"]),
        strategy=str(u.get("strategy", "none")),
        shared_by=max(1, int(u.get("sharedBy", 1))),
        share_id=None if u.get("shareID") is None else str(u["shareID"]),
        entitlement_mib=optional_int("entitlementMiB"),
        thread_percentage=optional_int("threadPercentage"),
        admin=u.get("admin") is True,
    )


def _device_json(d: PreparedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requests": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiIDs": list(d.cdi_ids),
    }
    if d.share_id is not None:
        out["shareID"] = d.share_id
    return out


def _applied_json(a: AppliedSharing) -> dict[str, Any]:
    out: dict[str, Any] = {"strategy": a.strategy, "gpus": list(a.gpu_uuids)}
    if a.mps_key:
        out["mpsKey"] = a.mps_key
    if a.interval is not None:
        out["interval"] = a.interval
    if a.thread_percentage is not None:
        out["threadPercentage"] = a.thread_percentage
    if a.limits_mib:
        out["limitsMiB"] = [[index, mib] for index, mib in a.limits_mib]
    return out


def _claim(uid: object, c: Mapping[str, Any]) -> PreparedClaim:
    state = c["state"]
    if state not in ("PrepareStarted", "PrepareCompleted"):
        raise ValueError(f"claim {uid}: unknown state {state!r}")
    return PreparedClaim(
        uid=str(uid),
        namespace=str(c["namespace"]),
        name=str(c["name"]),
        state=state,
        devices=tuple(
            PreparedDevice(
                request_names=tuple(str(r) for r in d.get("requests", ())),
                pool=str(d["pool"]),
                device=str(d["device"]),
                cdi_ids=tuple(str(i) for i in d.get("cdiIDs", ())),
                share_id=None if d.get("shareID") is None else str(d["shareID"]),
            )
            for d in c.get("devices", ())
        ),
        applied=tuple(
            AppliedSharing(
                strategy=str(a["strategy"]),
                gpu_uuids=tuple(str(g) for g in a.get("gpus", ())),
                mps_key=str(a.get("mpsKey", "")),
                interval=None if a.get("interval") is None else int(a["interval"]),
                thread_percentage=(
                    None if a.get("threadPercentage") is None else int(a["threadPercentage"])
                ),
                limits_mib=tuple((int(i), int(m)) for i, m in a.get("limitsMiB", ())),
            )
            for a in c.get("applied", ())
        ),
        uses=tuple(_use(u) for u in c.get("uses", ())),
        guard_mode=None if c.get("guardMode") is None else str(c["guardMode"]),
    )
