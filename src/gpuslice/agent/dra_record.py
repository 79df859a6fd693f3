"""The DRA driver's record at start: read it, drop what a reboot or a half-done Prepare
left, and rebuild a record that is corrupt, missing or incomplete from the node's CDI specs
and the API.

`RecordKeeper` owns reading the record (and an earlier build's, under its old name),
keeping an unreadable one aside and the rebuild; it settles the driver's state
(`agent.dra_state`) once, before the driver serves, then hands the claims' daemons to
`agent.dra_sharing.ClaimSharing`, undoes unfinished claims through
`agent.dra_unprepare.Unpreparer` and asks `agent.dra_prepare.Preparer` what a claim's
Prepare recorded. Writing the record is the state's, the one writer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gpuslice.agent.cdi_base import BaseSpec
from gpuslice.agent.dra_prepare import Preparer
from gpuslice.agent.dra_sharing import ClaimSharing
from gpuslice.agent.dra_state import DriverEvents, DriverState, _described
from gpuslice.agent.dra_unprepare import Unpreparer
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.core.dra.claims import ClaimError
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.names import BadName, check_claim_ref
from gpuslice.core.dra.prepared import Checkpoint, Decoded, PreparedClaim, decode
from gpuslice.core.dra.resource_claim import ResourceClaim
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile, CheckpointUnreadable
from gpuslice.logs import get_logger
from gpuslice.ports import DraObjects

log = get_logger("gpuslice.dra.driver")


class RecordKeeper:
    """Loads the record of prepared claims, rebuilding it where it cannot be used."""

    def __init__(
        self,
        state: DriverState,
        sharing: ClaimSharing,
        unpreparer: Unpreparer,
        preparer: Preparer,
        *,
        objects: DraObjects,
        cdi: CdiSpecStore,
        old_checkpoint: CheckpointFile | None,
        events: DriverEvents,
        base: BaseSpec | None,
        dynamic_mig: DynamicMig | None,
    ) -> None:
        self._state = state
        self._sharing = sharing
        self._unpreparer = unpreparer
        self._preparer = preparer
        self._objects = objects
        self._cdi = cdi
        self._old_checkpoint = old_checkpoint
        self._events = events
        self._base = base
        self._dynamic_mig = dynamic_mig

    async def load(self) -> None:
        """Read the record; drop what a reboot or a half-done Prepare left behind. A record
        that cannot be read, whatever is at its path, is kept aside and rebuilt from what
        the node and the API still say; the driver serves in every case."""
        if self._base is not None:  # before any Prepare, and what a rebuilt record returns
            await self._base.cdi_id(self._state.snapshot())
        if self._dynamic_mig is not None:
            # first: a rebuild of the DRA record must know which MIG devices are ours
            await self._dynamic_mig.read()
        try:
            raw = await asyncio.to_thread(self._state.checkpoint.read)
            decoded = decode(raw, self._state.boot_id)
        except CheckpointUnreadable as exc:
            decoded = Decoded("corrupt", Checkpoint(self._state.boot_id), str(exc))
        complete = True
        """Whether every prepared claim is known: what is not may then be cleaned up."""
        if decoded.status == "corrupt":
            claims, complete = await self._recover(decoded.reason)
        elif decoded.status == "empty":
            claims, complete = await self._without_record()
        elif decoded.status == "ok" and not decoded.checkpoint.complete:
            claims, complete = await self._complete_record(decoded.checkpoint.claims)
        else:
            if decoded.status == "stale":
                log.warning("dra-checkpoint-stale", reason=decoded.reason)
            claims = dict(decoded.checkpoint.claims)
        self._state.complete = complete
        claims = self._sharing.upgraded(claims)
        unfinished = [c for c in claims.values() if c.state != "PrepareCompleted"]
        for claim in unfinished:
            log.warning("dra-prepare-unfinished", claim=f"{claim.namespace}/{claim.name}")
            del claims[claim.uid]
        self._state.claims = claims
        # CDI specs of claims not (or no longer) prepared: a reboot, a crash mid-Prepare.
        for uid in await asyncio.to_thread(self._cdi.claims) if complete else ():
            if uid not in claims:
                await asyncio.to_thread(self._cdi.remove, uid)
                log.info("dra-cdi-orphan-removed", claim_uid=uid)
        self._sharing.take_over(claims.values())
        if decoded.status != "ok" or not decoded.checkpoint.complete:  # else it is as read
            await self._state.write_quietly()
        for claim in unfinished:
            # a Prepare cut short by a crash: undo what its planned steps may have done (its
            # MPS daemon quit, the GPU's compute mode and time-slice interval reset)
            await self._unpreparer.undo(claim.uid, claim.applied)
        await self._sharing.resume()
        if self._dynamic_mig is not None:
            # after the record: the instances of claims not prepared go, those of prepared
            # claims stay; with the record incomplete nothing is destroyed
            snap = self._state.snapshot()
            await self._dynamic_mig.reconcile(
                set(claims) if complete else None,
                [(c.uid, u.device, u.physical_uuid) for c in claims.values() for u in c.uses],
                # the dynamic GPUs: a static MIG device is never rebuilt as one made here
                list(self._state.offer(snap).dynamic) if snap is not None else [],
            )
        log.info(
            "dra-checkpoint-loaded", claims=len(claims), status=decoded.status, complete=complete
        )

    async def _without_record(self) -> tuple[dict[str, PreparedClaim], bool]:
        """No file at the record's path: a first start, or a record lost. Only the node
        tells them apart: with no CDI spec and no MPS daemon directory of this driver there
        is nothing to lose; otherwise the record is rebuilt (with what an earlier build
        kept under the old name, when that is ours). The claims, and whether they are all
        known."""
        path = self._state.checkpoint.path
        old = await self._old_record()
        specs = await asyncio.to_thread(self._cdi.claims)
        dirs = await asyncio.to_thread(self._sharing.daemon_dirs)
        if old is None and not specs and not dirs:
            return {}, True
        known = {uid: c for uid, c in (old or {}).items() if uid in specs}
        claims, complete, why = await self._rebuild(known)
        if old is not None:
            log.info(
                "dra-checkpoint-migrated",
                old=str(self._old_checkpoint.path if self._old_checkpoint else ""),
                path=str(path),
                claims=len(claims),
                complete=complete,
            )
            return claims, complete
        message = (
            f"DRA checkpoint {path} is missing while {len(specs)} CDI spec(s) and "
            f"{len(dirs)} MPS daemon director(ies) of this driver are on the node. "
            f"Rebuilt {len(claims)} prepared claim(s) {why}"
        )
        log.error("dra-checkpoint-missing", message=message)
        await self._events.post("CheckpointMissing", message)
        return claims, complete

    async def _old_record(self) -> dict[str, PreparedClaim] | None:
        """The record an earlier build kept under the old name, when it is one of ours
        written since this boot; None otherwise, and the file is left as it is (with
        NVIDIA's driver name it is NVIDIA's own checkpoint)."""
        if self._old_checkpoint is None:
            return None
        where = str(self._old_checkpoint.path)
        try:
            raw = await asyncio.to_thread(self._old_checkpoint.read)
        except CheckpointUnreadable as exc:
            log.info("dra-old-checkpoint-ignored", path=where, reason=str(exc))
            return None
        if raw is None:
            return None
        decoded = decode(raw, self._state.boot_id)
        if decoded.status != "ok":
            log.info("dra-old-checkpoint-ignored", path=where, reason=decoded.reason)
            return None
        return dict(decoded.checkpoint.claims)

    async def _complete_record(
        self, known: Mapping[str, PreparedClaim]
    ) -> tuple[dict[str, PreparedClaim], bool]:
        """A record an earlier start rebuilt without the API: its claims stand, and those
        of the CDI specs it lacks are read from the API again."""
        claims, complete, why = await self._rebuild(known)
        log.warning(
            "dra-checkpoint-incomplete",
            message=(
                f"DRA checkpoint {self._state.checkpoint.path} was rebuilt while the API could not "
                f"be read; now {len(claims)} prepared claim(s) {why}"
            ),
            complete=complete,
        )
        return claims, complete

    async def _recover(self, reason: str) -> tuple[dict[str, PreparedClaim], bool]:
        """Keep the unreadable record aside (never deleted), say so in the log and in a
        Warning Event naming the kept file, and rebuild the record: the claims allocated
        to this node (from the API) whose CDI spec this agent wrote are prepared, with what
        their Prepare would have recorded, so their MPS daemons are taken over and their
        Unprepare undoes them. With the API unreachable nothing is rebuilt and nothing on
        the node is cleaned up (a running pod's spec or daemon is never lost)."""
        path = self._state.checkpoint.path
        try:
            kept = await asyncio.to_thread(self._state.checkpoint.quarantine)
            where = f"kept as {kept}" if kept is not None else "gone before it could be kept"
        except OSError as exc:
            where = f"could not be moved aside ({exc}); records cannot be written until it is"
        claims, complete, why = await self._rebuild({})
        message = (
            f"DRA checkpoint {path} could not be used ({reason}); {where}. "
            f"Rebuilt {len(claims)} prepared claim(s) {why}"
        )
        log.error("dra-checkpoint-corrupt", message=message)
        await self._events.post("CheckpointCorrupt", message)
        return claims, complete

    async def _rebuild(
        self, known: Mapping[str, PreparedClaim]
    ) -> tuple[dict[str, PreparedClaim], bool, str]:
        """`known` and the claims of the CDI specs it lacks, read from the API (only those:
        `list_claims` keeps nothing else); whether every prepared claim is now known, and
        how the rebuild went, for the message. Every completed Prepare left a CDI spec,
        so when `known` covers them all no API read is needed."""
        rebuilt = dict(known)
        written = await asyncio.to_thread(self._cdi.claims)
        if not written and not known:
            return {}, True, "(no CDI spec of this driver on the node)"
        missing = written - known.keys()
        if not missing:
            return rebuilt, True, f"from the record kept and {len(written)} CDI spec(s)"
        try:
            listed = await asyncio.wait_for(
                self._objects.list_claims(missing), self._state.settings.rebuild_timeout_s
            )
        except Exception as exc:
            log.error("dra-rebuild-no-api", error=_described(exc))
            return (
                rebuilt,
                False,
                f"(the API could not be read: {_described(exc)}; nothing removed, the next "
                "start rebuilds again)",
            )
        for claim in listed:
            record = self._record_of(claim, missing)
            if record is not None:
                rebuilt[record.uid] = record
        gone = len(written - rebuilt.keys())
        return rebuilt, True, f"from the API and {len(written)} CDI spec(s); {gone} orphaned"

    def _record_of(self, claim: Mapping[str, object], written: set[str]) -> PreparedClaim | None:
        """What Prepare recorded for `claim`, derived again (the core decides it the same
        way every time) without touching the node; None for a claim not prepared here."""
        read = ResourceClaim.read(claim)
        if not isinstance(read.uid, str) or read.uid not in written:
            return None
        try:
            ref = check_claim_ref(ClaimRef(str(read.namespace), read.uid, str(read.name)))
            return self._preparer.rederive(read, ref)
        except (BadName, ClaimError) as exc:
            log.warning("dra-rebuild-skipped", claim_uid=read.uid, error=str(exc))
            return None
