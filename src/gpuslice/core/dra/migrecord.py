"""The record of the MIG devices gpuslice created for claims (dynamic MIG), and what a
restart makes of it.

Only instances gpuslice created may ever be destroyed by it: an operator's, another tool's,
or one left by an earlier static layout are not its to take. So each creation is recorded
before it is attempted (`creating`: GPU, profile, placement, claim) and again once it exists
(`created`: its UUID and GI/CI ids), each time on disk before going on; destruction checks
the UUID at those ids first (`ports.MigPartitioner.destroy_mig`).

After a crash the record is reconciled with what the GPUs hold (`recover`):

- `creating` with an instance of that profile at that placement that no other record
  holds: the crash fell between creation and the second record; the instance is ours.
  Without one, creation never happened: the record goes.
- `created` whose claim is prepared (the DRA record says `PrepareCompleted`): kept, the
  kubelet's repeated Prepare gets it back and Unprepare destroys it.
- `created` whose claim is not prepared (Prepare cut short; Unprepare cut short after the
  DRA record dropped the claim): destroyed, so the placement is free for a retry.
- With the DRA record unknown (lost, or rebuilt without the API) nothing is destroyed: a
  running pod's device is never taken on a guess.
- Written before a reboot: every instance died with it (MIG instances do not survive a GPU
  reset); the records go and nothing is destroyed, whatever now sits at those placements.

A record that cannot be read, or that is missing while prepared claims use MIG devices of
the dynamic GPUs, is rebuilt from the DRA record's device uses (claim, device name, MIG
UUID) for the instances that still exist there (`rebuilt`): the instances of prepared
claims are known again, and any other instance is left alone, reported, never destroyed.
The rebuilt record is written before the unreadable one is kept aside
(`host.checkpoint_file.CheckpointFile.replace_keeping`): a missing file is what a kill in
between used to leave.

The file is JSON in the DRA record's envelope (`prepared.sealed`: format name, version,
checksum).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpuslice.core.devices import MigDevice
from gpuslice.core.dra.prepared import sealed, unsealed
from gpuslice.core.jsontypes import Json

FORMAT = "gpuslice.io/dynamic-mig"
VERSION = 1


@dataclass(frozen=True, slots=True)
class CreatedMig:
    uuid: str
    gi_id: int
    ci_id: int


@dataclass(frozen=True, slots=True)
class MigRecord:
    """One MIG device gpuslice creates, or created, for a claim's device."""

    claim_uid: str
    device: str
    """The DRA device name the scheduler allocated (`gpu-0-mig-1g10gb-19-3`)."""
    gpu_uuid: str
    profile: str
    start: int
    created: CreatedMig | None = None
    """None: recorded before creation (`creating`)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.claim_uid, self.device)


@dataclass(frozen=True, slots=True)
class MigJournal:
    boot_id: str
    records: tuple[MigRecord, ...] = ()

    def of_claim(self, uid: str) -> tuple[MigRecord, ...]:
        return tuple(r for r in self.records if r.claim_uid == uid)

    def ours(self) -> frozenset[str]:
        """UUIDs of the instances gpuslice created and still holds."""
        return frozenset(r.created.uuid for r in self.records if r.created is not None)

    def put(self, record: MigRecord) -> MigJournal:
        kept = tuple(r for r in self.records if r.key != record.key)
        return replace(self, records=(*kept, record))

    def without(self, keys: Collection[tuple[str, str]]) -> MigJournal:
        return replace(self, records=tuple(r for r in self.records if r.key not in keys))


Status = Literal["ok", "empty", "stale", "corrupt"]


@dataclass(frozen=True, slots=True)
class DecodedJournal:
    status: Status
    journal: MigJournal
    reason: str = ""


def encode(journal: MigJournal) -> bytes:
    data = {
        "bootID": journal.boot_id,
        "records": [_record_json(r) for r in journal.records],
    }
    return sealed(data, FORMAT, VERSION)


def decode(raw: bytes | None, boot_id: str) -> DecodedJournal:
    empty = MigJournal(boot_id)
    if raw is None:
        return DecodedJournal("empty", empty)
    try:
        opened = unsealed(raw, (FORMAT,), "a gpuslice dynamic MIG record")
        if isinstance(opened, str):
            return DecodedJournal("corrupt", empty, opened)
        data, version = opened.data, opened.version
        if version != VERSION:
            return DecodedJournal("corrupt", empty, f"version {version!r} unknown")
        records = _records(data)
        stored = str(data.get("bootID", ""))
    except RecursionError:
        return DecodedJournal("corrupt", empty, "nested too deeply")
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return DecodedJournal("corrupt", empty, f"{type(exc).__name__}: {exc}")
    if boot_id and stored and stored != boot_id:
        return DecodedJournal("stale", empty, f"written before a reboot ({stored})")
    return DecodedJournal("ok", MigJournal(boot_id, records))


def _record_json(r: MigRecord) -> Json:
    out: Json = {
        "claimUID": r.claim_uid,
        "device": r.device,
        "gpuUUID": r.gpu_uuid,
        "profile": r.profile,
        "start": r.start,
    }
    if r.created is not None:
        out["created"] = {"uuid": r.created.uuid, "giID": r.created.gi_id, "ciID": r.created.ci_id}
    return out


def _records(data: Json) -> tuple[MigRecord, ...]:
    """`records`: a list of record objects; missing, null or empty, none. Anything else is
    a corrupt file (TypeError)."""
    listed = data.get("records")
    if not listed:
        return ()
    if not isinstance(listed, list):
        raise TypeError("records is not a list")
    return tuple(_record(r) for r in listed)


def _record(obj: Any) -> MigRecord:
    if not isinstance(obj, dict):
        raise TypeError("a record is not an object")
    created = obj.get("created")
    made = None
    if created is not None:
        if not isinstance(created, dict):
            raise TypeError("created is not an object")
        made = CreatedMig(_str(created, "uuid"), _int(created, "giID"), _int(created, "ciID"))
    return MigRecord(
        _str(obj, "claimUID"),
        _str(obj, "device"),
        _str(obj, "gpuUUID"),
        _str(obj, "profile"),
        _int(obj, "start"),
        made,
    )


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError(f"{key}: not a string of 1..256 characters")
    return value


def _int(obj: Mapping[str, Any], key: str) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 4096:
        raise ValueError(f"{key}: not a whole number 0..4095")
    return value


@dataclass(frozen=True, slots=True)
class Recovery:
    keep: tuple[MigRecord, ...]
    """Records that stand (instances adopted after a crash included)."""
    destroy: tuple[MigRecord, ...]
    """Instances gpuslice created for claims not prepared: destroyed (UUID checked)."""
    dropped: tuple[tuple[MigRecord, str], ...]
    """Records that go, with why (for the log)."""


def recover(
    records: Sequence[MigRecord],
    live: Mapping[str, Sequence[MigDevice]],
    prepared: Collection[str] | None,
) -> Recovery:
    """Reconcile `records` with the GPUs' `live` MIG devices (GPU UUID -> devices);
    `prepared`: the claim UIDs the DRA record holds as prepared, None when it is unknown."""
    recorded = {r.created.uuid for r in records if r.created is not None}
    keep: list[MigRecord] = []
    destroy: list[MigRecord] = []
    dropped: list[tuple[MigRecord, str]] = []
    for record in records:
        on_gpu = live.get(record.gpu_uuid, ())
        if record.created is None:
            found = [
                m
                for m in on_gpu
                if m.profile == record.profile
                and m.placement_start == record.start
                and m.uuid not in recorded
            ]
            if not found:
                dropped.append((record, "recorded before creation; never created"))
                continue
            mig = found[0]
            recorded.add(mig.uuid)
            record = replace(record, created=CreatedMig(mig.uuid, mig.gi_id, mig.ci_id))
        made = record.created
        assert made is not None
        if not any(m.uuid == made.uuid for m in on_gpu):
            dropped.append((record, "its instance is gone"))
        elif prepared is None or record.claim_uid in prepared:
            keep.append(record)
        else:
            destroy.append(record)
    return Recovery(tuple(keep), tuple(destroy), tuple(dropped))


def rebuilt(
    uses: Iterable[tuple[str, str, str]], live: Mapping[str, Sequence[MigDevice]]
) -> tuple[MigRecord, ...]:
    """Records for the prepared claims' MIG devices that still exist, from the DRA record's
    uses: (claim UID, device name, physical UUID). What no prepared claim uses is not
    recorded, so it is never destroyed."""
    by_uuid: dict[str, tuple[str, MigDevice]] = {
        m.uuid: (gpu, m) for gpu, migs in live.items() for m in migs
    }
    out: list[MigRecord] = []
    for claim_uid, device, physical in uses:
        found = by_uuid.get(physical)
        if found is None:
            continue
        gpu, mig = found
        created = CreatedMig(mig.uuid, mig.gi_id, mig.ci_id)
        out.append(MigRecord(claim_uid, device, gpu, mig.profile, mig.placement_start, created))
    return tuple(out)
