"""The DRA driver's undo of a claim: Unprepare (undo what its record says or, for a claim
the record does not hold, remove what was left under its UID), and the same undo for a
Prepare that failed and for a claim the record left unfinished.

`Unpreparer` owns the one way a claim is undone on the node: its sharing
(`agent.dra_sharing.ClaimSharing.undo`), then its CDI spec, then the MIG devices made for
it (`agent.dynamic_mig`). Prepare (`agent.dra_prepare`) and the record's load
(`agent.dra_record`) undo through it, so the order is written once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gpuslice.agent.dra_sharing import ClaimSharing
from gpuslice.agent.dra_state import DriverState
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.names import BadName, check_claim_ref
from gpuslice.core.dra.prepared import AppliedSharing
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.logs import get_logger

log = get_logger("gpuslice.dra.driver")


class Unpreparer:
    """Unprepares one claim, and undoes what a claim left."""

    def __init__(
        self,
        state: DriverState,
        sharing: ClaimSharing,
        *,
        cdi: CdiSpecStore,
        dynamic_mig: DynamicMig | None,
    ) -> None:
        self._state = state
        self._sharing = sharing
        self._cdi = cdi
        self._dynamic_mig = dynamic_mig

    async def unprepare_claim(self, ref: ClaimRef) -> str:
        try:
            check_claim_ref(ref)
        except BadName as exc:
            log.warning("dra-unprepare-refused", error=str(exc))
            return f"refused: {exc}"
        async with self._state.claim_locks.holding([ref.uid]):
            # once begun, an Unprepare finishes: a cancelled one must not stop half a claim
            return await to_the_end(self._unprepare_one(ref))

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        claim = self._state.claims.get(ref.uid)
        if claim is None:
            # never prepared here, already unprepared, or prepared before a record was lost:
            # success either way, after removing anything left under this claim's UID
            await self._clean_unrecorded(ref.uid)
            return await self.release(ref)
        self._state.leaving.add(ref.uid)
        try:
            await self.undo(ref.uid, list(claim.applied))
            del self._state.claims[ref.uid]
            try:
                await self._state.write()
            except OSError as exc:
                self._state.claims[ref.uid] = claim
                return f"ResourceClaim {ref.namespace}/{ref.name}: writing the checkpoint: {exc}"
        finally:
            self._state.leaving.discard(ref.uid)
        # the MIG devices last: what used them (daemons, the CDI spec) is gone; an error
        # keeps them recorded, and the kubelet's next Unprepare tries again
        if error := await self.release(ref):
            return f"ResourceClaim {ref.namespace}/{ref.name}: {error}"
        log.info("dra-unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
        return ""

    async def undo(self, claim_uid: str, applied: Sequence[AppliedSharing]) -> None:
        """Undo what the record says of the claim (`ClaimSharing.undo`, best effort), then
        remove its CDI spec: the one order Unprepare, a failed Prepare and a record's
        unfinished claim share."""
        await self._sharing.undo(claim_uid, applied)
        try:
            await asyncio.to_thread(self._cdi.remove, claim_uid)
        except (OSError, ValueError) as exc:
            log.warning("dra-cdi-remove-failed", claim_uid=claim_uid, error=str(exc))

    async def release(self, ref: ClaimRef) -> str:
        """Destroy the MIG devices created for the claim; "" or why not."""
        if self._dynamic_mig is None:
            return ""
        error = await to_the_end(self._dynamic_mig.release(ref.uid))
        if error:
            log.error(
                "dra-dynamic-mig-release-failed", claim=f"{ref.namespace}/{ref.name}", error=error
            )
        return error

    async def _clean_unrecorded(self, claim_uid: str) -> None:
        """The CDI spec and the claim MPS daemons (`<uid>-<digest>`) of a claim the record
        does not hold: left when a lost record could not be rebuilt (the API unreachable
        at start). The UID was checked where the request entered."""
        try:
            if await asyncio.to_thread(self._cdi.remove, claim_uid):
                log.info("dra-cdi-unrecorded-removed", claim_uid=claim_uid)
        except (OSError, ValueError) as exc:
            log.warning("dra-cdi-remove-failed", claim_uid=claim_uid, error=str(exc))
        await self._sharing.quit_unrecorded(claim_uid)
