"""The DRA driver's Unprepare of one claim: undo what its record says, or, for a claim
the record does not hold, remove what was left under its UID (`agent.dra_driver`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuslice.agent.dra_prepare import Preparing
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.dra.claims import daemon_spec
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.names import BadName, check_claim_ref
from gpuslice.logs import get_logger

log = get_logger("gpuslice.dra.driver")


class Unpreparing(Preparing):
    """Unprepares one claim."""

    async def _unprepare_claim(self, ref: ClaimRef) -> str:
        try:
            check_claim_ref(ref)
        except BadName as exc:
            log.warning("dra-unprepare-refused", error=str(exc))
            return f"refused: {exc}"
        async with self._claim_locks.holding([ref.uid]):
            # once begun, an Unprepare finishes: a cancelled one must not stop half a claim
            return await to_the_end(self._unprepare_one(ref))

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        claim = self._claims.get(ref.uid)
        if claim is None:
            # never prepared here, already unprepared, or prepared before a record was lost:
            # success either way, after removing anything left under this claim's UID
            await self._clean_unrecorded(ref.uid)
            return await self._release(ref)
        self._leaving.add(ref.uid)
        try:
            await self._undo(ref.uid, list(claim.applied))
            del self._claims[ref.uid]
            try:
                await self._write()
            except OSError as exc:
                self._claims[ref.uid] = claim
                return f"ResourceClaim {ref.namespace}/{ref.name}: writing the checkpoint: {exc}"
        finally:
            self._leaving.discard(ref.uid)
        # the MIG devices last: what used them (daemons, the CDI spec) is gone; an error
        # keeps them recorded, and the kubelet's next Unprepare tries again
        if error := await self._release(ref):
            return f"ResourceClaim {ref.namespace}/{ref.name}: {error}"
        log.info("dra-unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
        return ""

    async def _clean_unrecorded(self, claim_uid: str) -> None:
        """The CDI spec and the claim MPS daemons (`<uid>-<digest>`) of a claim the record
        does not hold: left when a lost record could not be rebuilt (the API unreachable
        at start). The UID was checked where the request entered."""
        try:
            if await asyncio.to_thread(self._cdi.remove, claim_uid):
                log.info("dra-cdi-unrecorded-removed", claim_uid=claim_uid)
        except (OSError, ValueError) as exc:
            log.warning("dra-cdi-remove-failed", claim_uid=claim_uid, error=str(exc))
        if self._mps is None:
            return
        root = Path(self.settings.mps_root)
        try:
            keys = await asyncio.to_thread(
                lambda: sorted(
                    p.name
                    for p in root.iterdir()
                    if p.name.startswith(f"{claim_uid}-") and (p / "pipe").is_dir()
                )
            )
        except FileNotFoundError:
            return
        for key in keys:
            if key in self._daemons:
                continue
            await self._mps.quit_stray(daemon_spec(key, self.settings.mps_root, []))
            await asyncio.to_thread(self._remove_daemon_dir, key)
            log.info("dra-mps-unrecorded-quit", claim_uid=claim_uid, daemon=key)
