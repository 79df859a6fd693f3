"""The DRA driver's record of prepared claims, as bytes that survive upgrades and reboots.

The kubelet calls Prepare again after it restarts and only sends namespace, UID and name at
Unprepare, so the driver keeps, per claim, what it returned and what it changed on the node.
NVIDIA's driver crash-loops on its own checkpoint after an upgrade (a new field changed
the checksum, kubernetes-sigs/dra-driver-nvidia-gpu#1080) and after corruption (#1100), and
took claims recorded before a reboot as still prepared (#951). Here:

* the checksum covers the stored `data` object exactly as written, whatever fields it has,
  and a reader ignores fields it does not know, so files written by a newer version read;
* decoding never raises: bad bytes come back as `corrupt` with the reason (the adapter
  moves the file aside and rebuilds what it can). Whatever the bytes: JSON nested deeper
  than Python's parser goes, numbers that are not plain integers in range (`1e400`, NaN,
  a `sharedBy` of 10**400), names that could leave a directory (a claim UID or MPS key
  holding `/` or `..`; `core.dra.names`) all make the document corrupt, checksum or not
  (only root writes the file, so a bad name there is defence in depth);
* the node's boot ID is stored; a different one means a reboot: nothing prepared survives
  one (MPS daemons, time-slice settings), so the record is `stale` and dropped;
* a record rebuilt while the API could not be read says so: it may lack claims that are
  still prepared, so the next start rebuilds it again and, until a rebuild succeeds,
  nothing on the node is removed for not being in it. It says so with its format name
  (`INCOMPLETE_FORMAT`), not with a field inside version 1: a release before this one
  ignores fields it does not know, so on a rollback it read such a record as complete and
  empty and deleted every running claim's CDI spec and MPS daemon. Under another format
  name every earlier release refuses the file as not its checkpoint, moves it aside and
  rebuilds, as this one does with any record it cannot read. A complete record is written
  as it always was, so it reads the same in every version; the `incomplete` field that
  release wrote is still read.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuslice.core.dra.kubelet_api import PreparedDevice
from gpuslice.core.dra.names import (
    BadName,
    check_claim_uid,
    check_namespace,
    check_object_name,
    check_path_component,
)
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import SharingStrategy

FORMAT = "gpuslice.io/dra-checkpoint"
INCOMPLETE_FORMAT = "gpuslice.io/dra-checkpoint-incomplete"
"""The format name of a record that may lack prepared claims (see the module's docstring):
the same document, which no reader that knows only `FORMAT` accepts."""
VERSION = 1
"""The version this code writes. A change an older reader can ignore (a new optional
field) keeps it; one it cannot (a field renamed, a meaning changed) bumps it and adds the
step from the previous version to `MIGRATIONS`, so files written before still read (as
NVIDIA's `checkpoint.go` migrates its V1 to V2)."""

Migration = Callable[[Json], Json]
MIGRATIONS: Mapping[int, Migration] = {}
"""Version n's `data` -> version n+1's, for every n below VERSION (none yet: version 1 is the
only one written so far)."""
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
    """The daemon's (device index, MiB) pinned memory limits (`MpsDaemonSpec`)."""
    mig_uuids: tuple[str, ...] = ()
    """The MIG devices the daemon serves (its `CUDA_VISIBLE_DEVICES`); empty: whole GPUs.
    Kept so a restarted agent rebuilds the same daemon and takes it over."""
    multi_user: bool = False
    """The daemon was started multi-user (`-M`), for the same reason."""
    compute_mode: Literal["EXCLUSIVE_PROCESS"] | None = None
    """The compute mode set on `gpu_uuids` (EXCLUSIVE_PROCESS for an MPS daemon), to reset
    to DEFAULT at Unprepare. A reader that does not know the field reads the step as one
    that changed nothing."""


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """What the claim's pods are entitled to on one device, for attribution and the guard
    (kept so a restarted agent keeps guarding claims prepared before it)."""

    device: str
    physical_uuid: str
    """The GPU's or the MIG device's UUID."""
    strategy: SharingStrategy
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
    complete: bool = True
    """False: rebuilt without the API, claims still prepared may be missing from it."""


@dataclass(frozen=True, slots=True)
class Decoded:
    status: Literal["ok", "empty", "stale", "corrupt"]
    checkpoint: Checkpoint
    reason: str = ""


def encode(cp: Checkpoint) -> bytes:
    data: Json = {
        "bootID": cp.boot_id,
        "claims": {uid: _claim_json(c) for uid, c in sorted(cp.claims.items())},
    }
    return sealed(data, FORMAT if cp.complete else INCOMPLETE_FORMAT)


def sealed(data: Mapping[str, Any], format: str = FORMAT, version: int = VERSION) -> bytes:
    """`data` as a checkpoint document: the format, the version and the checksum around it
    (also how the corrupt-checkpoint corpus makes documents that pass the checksum, and the
    envelope of the dynamic MIG record, `core.dra.migrecord`)."""
    doc = {"format": format, "version": version, "checksum": _checksum(data), "data": data}
    # compact: `indent` falls back to the pure-Python encoder, 7x slower at 64 claims, and
    # the file is written twice per Prepare
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def decode(raw: bytes | None, boot_id: str) -> Decoded:
    if raw is None:
        return Decoded("empty", Checkpoint(boot_id))
    try:
        opened = unsealed(raw, (FORMAT, INCOMPLETE_FORMAT), "a gpuslice DRA checkpoint")
        if isinstance(opened, str):
            return Decoded("corrupt", Checkpoint(boot_id), opened)
        data = migrate(opened.data, opened.version)
        stored = data.get("claims")
        if stored is not None and not isinstance(stored, dict):
            raise ValueError("claims: not an object")
        claims = {str(uid): _claim(uid, c) for uid, c in (stored or {}).items()}
        stored_boot = str(data.get("bootID", ""))
        # `incomplete` inside FORMAT: how the release before INCOMPLETE_FORMAT said it
        complete = opened.format == FORMAT and data.get("incomplete") is not True
    except RecursionError:
        return Decoded("corrupt", Checkpoint(boot_id), "nested too deeply to be a checkpoint")
    except BadName as exc:
        return Decoded("corrupt", Checkpoint(boot_id), f"a name that cannot be used: {exc}")
    except (
        UnicodeDecodeError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        OverflowError,
    ) as exc:
        return Decoded("corrupt", Checkpoint(boot_id), f"{type(exc).__name__}: {exc}")
    if boot_id and stored_boot and stored_boot != boot_id:
        return Decoded("stale", Checkpoint(boot_id), f"written before a reboot ({stored_boot})")
    return Decoded("ok", Checkpoint(boot_id, claims, complete))


@dataclass(frozen=True, slots=True)
class Unsealed:
    """A sealed document opened: its data, the version it claims and its format name."""

    data: Json
    version: object
    format: str


def unsealed(raw: bytes, formats: Collection[str], what: str) -> Unsealed | str:
    """A sealed document of one of `formats`, or why it is not one (`what` names it in
    that reason). Raises what `json` raises on a text that is no JSON, which callers count
    as corruption with their own other decoding errors."""
    doc = json.loads(raw.decode("utf-8"), parse_float=_no_float, parse_constant=_no_float)
    if not isinstance(doc, dict) or doc.get("format") not in formats:
        return f"not {what}"
    data = doc.get("data")
    if not isinstance(data, dict) or doc.get("checksum") != _checksum(data):
        return "checksum mismatch"
    return Unsealed(data, doc.get("version"), str(doc["format"]))


def migrate(
    data: Json,
    version: object,
    migrations: Mapping[int, Migration] = MIGRATIONS,
    current: int = VERSION,
) -> Json:
    """`data` written at `version`, as this version reads it: each step from there up to
    `current` (VERSION) applied in turn. A newer version's data is read as it is, its added fields
    ignored (forward-readable). ValueError (the file is corrupt) for a version that is not
    a positive integer, or one older than any step reaches."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version {str(version)[:40]!r} is not a checkpoint version")
    for step in range(version, current):
        if step not in migrations:
            raise ValueError(f"version {step} cannot be read by version {current}")
        data = migrations[step](data)
    return data


def _no_float(text: str) -> Any:
    """Every number the checkpoint holds is an integer: `1e400`, `0.5`, NaN are not ours."""
    raise ValueError(f"{text[:40]!r} is not an integer")


_MAX = 2**53
"""Larger than any count, index or MiB figure a node has; JSON readers elsewhere agree."""


def _int(value: object, what: str, low: int = 0, high: int = _MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what}: {str(value)[:40]!r} is not an integer in [{low}, {high}]")
    return value


def _optional_int(value: object, what: str, low: int = 0, high: int = _MAX) -> int | None:
    return None if value is None else _int(value, what, low, high)


_MIG_UUID = re.compile(r"MIG-[A-Za-z0-9/_-]{1,120}")


def _mig_uuids(value: object) -> tuple[str, ...]:
    """`migDevices`: MIG UUIDs only, since they become a daemon's `CUDA_VISIBLE_DEVICES`
    (a comma or a GPU's UUID there would widen what the daemon opens)."""
    if not isinstance(value, list) or len(value) > 4096:
        raise ValueError(f"migDevices: {str(value)[:40]!r} is not a list of MIG UUIDs")
    for uuid in value:
        if not isinstance(uuid, str) or _MIG_UUID.fullmatch(uuid) is None:
            raise ValueError(f"migDevices: {str(uuid)[:40]!r} is not a MIG UUID")
    return tuple(value)


def _checksum(data: Mapping[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _claim_json(c: PreparedClaim) -> Json:
    out: Json = {"namespace": c.namespace, "name": c.name, "state": c.state}
    if c.devices:
        out["devices"] = [_device_json(d) for d in c.devices]
    if c.applied:
        out["applied"] = [_applied_json(a) for a in c.applied]
    if c.uses:
        out["uses"] = [_use_json(u) for u in c.uses]
    if c.guard_mode is not None:
        out["guardMode"] = c.guard_mode
    return out


def _use_json(u: DeviceUse) -> Json:
    out: Json = {
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
    return DeviceUse(
        device=str(u["device"]),
        physical_uuid=str(u["physical"]),
        strategy=_strategy(u.get("strategy")),
        shared_by=_int(u.get("sharedBy", 1), "sharedBy", 1, 1_000_000),
        share_id=None if u.get("shareID") is None else str(u["shareID"]),
        entitlement_mib=_optional_int(u.get("entitlementMiB"), "entitlementMiB"),
        thread_percentage=_optional_int(u.get("threadPercentage"), "threadPercentage", 0, 100),
        admin=u.get("admin") is True,
    )


def _strategy(value: object) -> SharingStrategy:
    """A use's strategy; one this version does not know (written by a newer one) reads as
    NONE, which is what this version made of it before the field was typed: not MPS, not
    time-sliced, so the device's whole memory is the claim's entitlement."""
    known = {s.value: s for s in SharingStrategy}
    return (
        known.get(value, SharingStrategy.NONE) if isinstance(value, str) else SharingStrategy.NONE
    )


def _device_json(d: PreparedDevice) -> Json:
    out: Json = {
        "requests": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiIDs": list(d.cdi_ids),
    }
    if d.share_id is not None:
        out["shareID"] = d.share_id
    return out


def _applied_json(a: AppliedSharing) -> Json:
    out: Json = {"strategy": a.strategy, "gpus": list(a.gpu_uuids)}
    if a.mps_key:
        out["mpsKey"] = a.mps_key
    if a.interval is not None:
        out["interval"] = a.interval
    if a.thread_percentage is not None:
        out["threadPercentage"] = a.thread_percentage
    if a.limits_mib:
        out["limitsMiB"] = [[index, mib] for index, mib in a.limits_mib]
    if a.mig_uuids:
        out["migDevices"] = list(a.mig_uuids)
    if a.multi_user:
        out["multiUser"] = True
    if a.compute_mode is not None:
        out["computeMode"] = a.compute_mode
    return out


def _applied(a: Mapping[str, Any]) -> AppliedSharing:
    mps_key = str(a.get("mpsKey", ""))
    if mps_key:
        check_path_component(mps_key, "mpsKey")  # it names a directory under the MPS root
    return AppliedSharing(
        strategy=str(a["strategy"]),
        gpu_uuids=tuple(str(g) for g in a.get("gpus", ())),
        mps_key=mps_key,
        interval=_optional_int(a.get("interval"), "interval", 0, 1000),
        thread_percentage=_optional_int(a.get("threadPercentage"), "threadPercentage", 0, 100),
        limits_mib=tuple(
            (_int(i, "limitsMiB index", 0, 4096), _int(m, "limitsMiB", 0))
            for i, m in a.get("limitsMiB", ())
        ),
        mig_uuids=_mig_uuids(a.get("migDevices", [])),
        multi_user=a.get("multiUser") is True,
        compute_mode=_compute_mode(a.get("computeMode")),
    )


def _compute_mode(value: object) -> Literal["EXCLUSIVE_PROCESS"] | None:
    """Only the mode this version sets; any other (a newer version's) reads as none, so
    nothing this version does not know is reset."""
    return "EXCLUSIVE_PROCESS" if value == "EXCLUSIVE_PROCESS" else None


def _claim(uid: object, c: Mapping[str, Any]) -> PreparedClaim:
    state = c["state"]
    if state not in ("PrepareStarted", "PrepareCompleted"):
        raise ValueError(f"claim {str(uid)[:40]}: unknown state {str(state)[:40]!r}")
    return PreparedClaim(
        uid=check_claim_uid(str(uid), "claims key"),
        namespace=check_namespace(str(c["namespace"]), "namespace"),
        name=check_object_name(str(c["name"]), "name"),
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
        applied=tuple(_applied(a) for a in c.get("applied", ())),
        uses=tuple(_use(u) for u in c.get("uses", ())),
        guard_mode=None if c.get("guardMode") is None else str(c["guardMode"]),
    )
