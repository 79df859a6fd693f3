"""Creating and destroying the MIG devices of dynamic-MIG claims, with their record.

The scheduler allocated a partition (`core.dra.partitions`): a profile at a placement on a
GPU. Prepare calls `materialize` for it, which records the creation, creates the instance
through the backend (`ports.MigPartitioner`), records what was created and checks it is
there; the driver then writes the CDI spec for that MIG device as for a static one.
Unprepare calls `release`, which destroys what the record holds for the claim (checked by
UUID) and forgets it. The record and its reconciliation after a crash are the core's
(`core.dra.migrecord`); this module is the order of the steps and the writes between them.

A repeated Prepare (the kubelet after its restart) finds the record and the live instance
and creates nothing. A placement someone else's instance holds is refused with that
instance named, before anything is recorded; so is a GPU not in MIG mode (gpuslice never
toggles it). Backend calls block (NVML does): they run off the loop, one per GPU at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import replace

from gpuslice.aio.keyed_locks import KeyedLocks
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.devices import MigDevice
from gpuslice.core.dra.claims import ClaimError
from gpuslice.core.dra.migrecord import (
    CreatedMig,
    MigJournal,
    MigRecord,
    decode,
    encode,
    rebuilt,
    recover,
)
from gpuslice.core.dra.partitions import Partition, in_the_way
from gpuslice.host.checkpoint_file import CheckpointFile, CheckpointUnreadable
from gpuslice.logs import get_logger
from gpuslice.ports import BackendError, MigGone, MigNotOurs, MigPartitioner

log = get_logger("gpuslice.dra.dynamic_mig")

JOURNAL_NAME = "gpuslice-dynamic-mig.json"
"""Beside the DRA record in the plugin directory."""

Warn = Callable[[str, str], Awaitable[None]]


class DynamicMig:
    def __init__(
        self,
        partitioner: MigPartitioner,
        file: CheckpointFile,
        boot_id: str,
        *,
        warn: Warn | None = None,
    ) -> None:
        self._backend = partitioner
        self._file = file
        self._journal = MigJournal(boot_id)
        self._decoded = decode(None, boot_id)
        self._boot_id = boot_id
        self._warn = warn
        self._gpu_locks = KeyedLocks()
        self._write_lock = asyncio.Lock()

    @property
    def journal(self) -> MigJournal:
        return self._journal

    def ours(self) -> frozenset[str]:
        """UUIDs of the MIG devices gpuslice created and holds: every other instance on a
        dynamic GPU is someone else's (`core.dra.partitions`, `foreign`)."""
        return self._journal.ours()

    def created_for(self, claim_uid: str) -> dict[str, CreatedMig]:
        """Device name -> the instance created for it, of one claim."""
        return {
            r.device: r.created for r in self._journal.of_claim(claim_uid) if r.created is not None
        }

    # -- start -----------------------------------------------------------------------------

    async def load(
        self,
        prepared: Collection[str] | None,
        uses: Iterable[tuple[str, str, str]] = (),
        gpus: Collection[str] = (),
    ) -> None:
        """`read` then `reconcile`, for a start where the DRA record is known first."""
        await self.read()
        await self.reconcile(prepared, uses, gpus)

    async def read(self) -> None:
        """Read the record, destroying nothing: from here `ours` names the instances it
        says gpuslice created, so the DRA record's rebuild (which derives each claim's
        devices again) finds a prepared claim's partition with its MIG device instead of
        taking that instance for someone else's."""
        try:
            raw = await asyncio.to_thread(self._file.read)
            decoded = decode(raw, self._boot_id)
        except CheckpointUnreadable as exc:
            decoded = replace(decode(b"", self._boot_id), reason=str(exc))
        if decoded.status == "stale":
            log.warning("dynamic-mig-record-stale", reason=decoded.reason)
        self._decoded = decoded
        self._journal = decoded.journal

    async def reconcile(
        self,
        prepared: Collection[str] | None,
        uses: Iterable[tuple[str, str, str]] = (),
        gpus: Collection[str] = (),
    ) -> None:
        """Reconcile the record `read` found with the GPUs (`core.dra.migrecord.recover`):
        `prepared` are the claims the DRA record holds as prepared (None: unknown, then
        nothing is destroyed); `uses` its (claim UID, device, physical UUID) triples, which
        rebuild a record that cannot be read or is missing, looking on `gpus` (the dynamic
        GPUs only: a static MIG device a claim uses is never taken for one gpuslice made)."""
        decoded = self._decoded
        records = decoded.journal.records
        if decoded.status == "corrupt":
            live = await self._live(gpus)
            records = rebuilt(uses, live)
            # the rebuilt record is in place before the old one is kept aside: an agent
            # killed in between leaves one or the other at the path, never no record
            kept = await asyncio.to_thread(
                self._file.replace_keeping, encode(MigJournal(self._boot_id, records))
            )
            message = (
                f"dynamic MIG record {self._file.path} could not be used ({decoded.reason}); "
                f"kept as {kept}. Rebuilt {len(records)} record(s) from the prepared claims; "
                "MIG devices no prepared claim uses are left alone"
            )
            log.error("dynamic-mig-record-corrupt", message=message)
            await self._post("DynamicMigRecordCorrupt", message)
        elif decoded.status == "empty":
            # no file: a first start, or a record lost (removed by hand; an earlier build
            # killed between setting a corrupt one aside and writing its rebuild). Only the
            # prepared claims' MIG devices that live on the dynamic GPUs tell them apart
            records = rebuilt(uses, await self._live(gpus))
            if records:
                message = (
                    f"dynamic MIG record {self._file.path} is missing while prepared claims "
                    f"use {len(records)} MIG device(s) on dynamic MIG GPUs; rebuilt from "
                    "those claims, so Unprepare destroys them; MIG devices no prepared "
                    "claim uses are left alone"
                )
                log.error("dynamic-mig-record-missing", message=message)
                await self._post("DynamicMigRecordMissing", message)
        live = await self._live({r.gpu_uuid for r in records})
        plan = recover(records, live, prepared)
        for record, why in plan.dropped:
            log.info(
                "dynamic-mig-record-dropped", device=record.device, claim=record.claim_uid, why=why
            )
        self._journal = MigJournal(self._boot_id, (*plan.keep, *plan.destroy))
        await self._write()
        for record in plan.destroy:
            await self._destroy(record)
        log.info(
            "dynamic-mig-loaded",
            kept=len(plan.keep),
            destroyed=len(plan.destroy),
            dropped=len(plan.dropped),
            status=decoded.status,
        )

    async def _live(self, gpus: Iterable[str]) -> dict[str, tuple[MigDevice, ...]]:
        out: dict[str, tuple[MigDevice, ...]] = {}
        for gpu in sorted(gpus):
            try:
                out[gpu] = await asyncio.to_thread(self._backend.live_mig_devices, gpu)
            except BackendError as exc:
                log.warning("dynamic-mig-gpu-unreadable", gpu=gpu, error=str(exc))
                out[gpu] = ()
        return out

    # -- prepare ---------------------------------------------------------------------------

    async def materialize(self, claim_uid: str, part: Partition) -> MigDevice:
        """The MIG device of `part` for the claim: the one already made for it, or a new
        one. ClaimError when it cannot be made (the record then holds nothing of it)."""
        gpu = part.gpu.uuid
        async with self._gpu_locks.holding([gpu]):
            live = await self._live_or_fail(gpu)
            for record in self._journal.of_claim(claim_uid):
                if record.device == part.name and record.created is not None:
                    found = [m for m in live if m.uuid == record.created.uuid]
                    if found:
                        return found[0]  # prepared before (a repeated Prepare)
                    await self._forget([record.key])  # gone meanwhile: made again below
            where = f"{part.profile.name} at memory slices {part.start}..{part.slots[-1]}"
            # the live GPU, not the snapshot the partition came from: an instance made since
            # (an operator's) is named, not left to the driver's terse refusal
            why = in_the_way(part, live, "which gpuslice did not create for this claim")
            if why is not None:
                raise ClaimError(f"device {part.name}: {why}")
            record = MigRecord(claim_uid, part.name, gpu, part.profile.name, part.start)
            self._journal = self._journal.put(record)
            try:
                await self._write()  # recorded before it exists: a crash leaves no stranger
            except OSError as exc:
                self._journal = self._journal.without([record.key])
                raise ClaimError(
                    f"device {part.name}: recording the creation of {where} first: {exc}; "
                    "nothing was created"
                ) from None
            try:
                # not cut short: a cancelled Prepare waits for the creation and its record,
                # so what it made is known and its undo destroys it
                made = await to_the_end(self._create(record))
            except BackendError as exc:
                await to_the_end(self._forget([record.key]))
                raise ClaimError(f"device {part.name}: creating {where}: {exc}") from None
            made_record, mig = made
            check = await self._live_or_fail(gpu)
            if not any(
                m.uuid == mig.uuid and m.placement_start == part.start and m.profile == mig.profile
                for m in check
            ):
                await to_the_end(self._destroy(made_record))
                raise ClaimError(
                    f"device {part.name}: the MIG device created for {where} ({mig.uuid}) is "
                    "not listed at that placement afterwards; destroyed again"
                )
            log.info(
                "dynamic-mig-created",
                claim_uid=claim_uid,
                device=part.name,
                mig=mig.uuid,
                gi=mig.gi_id,
                ci=mig.ci_id,
            )
            return mig

    async def _create(self, record: MigRecord) -> tuple[MigRecord, MigDevice]:
        """Create the instance `record` describes and record it as created."""
        mig = await asyncio.to_thread(
            self._backend.create_mig, record.gpu_uuid, record.profile, record.start
        )
        made = replace(record, created=CreatedMig(mig.uuid, mig.gi_id, mig.ci_id))
        self._journal = self._journal.put(made)
        await self._write()
        return made, mig

    async def _live_or_fail(self, gpu: str) -> tuple[MigDevice, ...]:
        try:
            return await asyncio.to_thread(self._backend.live_mig_devices, gpu)
        except BackendError as exc:
            raise ClaimError(f"reading GPU {gpu}'s MIG devices: {exc}") from None

    # -- unprepare -------------------------------------------------------------------------

    async def release(self, claim_uid: str) -> str:
        """Destroy the MIG devices created for the claim; "" or the error."""
        errors = []
        for record in self._journal.of_claim(claim_uid):
            async with self._gpu_locks.holding([record.gpu_uuid]):
                error = await self._destroy(record)
            if error:
                errors.append(error)
        return "; ".join(errors)

    async def _destroy(self, record: MigRecord) -> str:
        """Destroy one recorded instance and forget it; "" or why it is kept in the record
        (the next Unprepare or start tries again)."""
        made = record.created
        if made is None:  # recorded, creation failed or never happened
            await self._forget([record.key])
            return ""
        try:
            await asyncio.to_thread(
                self._backend.destroy_mig, record.gpu_uuid, made.uuid, made.gi_id, made.ci_id
            )
        except MigGone:
            log.info("dynamic-mig-already-gone", device=record.device, mig=made.uuid)
        except MigNotOurs as exc:
            log.warning("dynamic-mig-not-ours", device=record.device, error=str(exc))
            await self._post("DynamicMigNotOurs", str(exc))
        except BackendError as exc:
            log.error("dynamic-mig-destroy-failed", device=record.device, error=str(exc))
            return f"destroying MIG device {made.uuid} of {record.device}: {exc}"
        else:
            log.info("dynamic-mig-destroyed", claim_uid=record.claim_uid, mig=made.uuid)
        await self._forget([record.key])
        return ""

    # -- the record --------------------------------------------------------------------------

    async def _forget(self, keys: Collection[tuple[str, str]]) -> None:
        self._journal = self._journal.without(keys)
        await self._write()

    async def _write(self) -> None:
        async with self._write_lock:
            await asyncio.to_thread(self._file.write, encode(self._journal))

    async def _post(self, reason: str, message: str) -> None:
        if self._warn is None:
            return
        try:
            await self._warn(reason, message)
        except Exception as exc:  # an Event is a courtesy; never fail the driver over it
            log.warning("dynamic-mig-event-failed", reason=reason, error=str(exc))
