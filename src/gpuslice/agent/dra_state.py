"""What the DRA driver's pieces share: the record of prepared claims (the claims, whether
it is complete, its file and its one writer), the claims in flight and leaving, the
per-claim and per-GPU locks, and the node's offer as the driver reads it.

`agent.dra_driver.DraDriver` is a facade over collaborating pieces, one module each, each
given only what it uses: this state, which all of them share; the claims' sharing on the
node (`agent.dra_sharing.ClaimSharing`: MPS daemons, compute modes, time-slice intervals
and their undo); the undo of a claim (`agent.dra_unprepare.Unpreparer`: Unprepare, and
what a failed Prepare or a record's unfinished claim leaves); Prepare
(`agent.dra_prepare.Preparer`); and the record's load and rebuild
(`agent.dra_record.RecordKeeper`). What one piece owns (the MPS daemons, the compute-mode
and interval setters, the caps) the others reach only through its methods; the state is
one object, so no piece keeps a second copy of a claim or a flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.aio.keyed_locks import KeyedLocks
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.dra.prepared import AppliedSharing, Checkpoint, DeviceUse, PreparedClaim, encode
from gpuslice.core.policy import DraOffer
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.logs import get_logger
from gpuslice.state import Snapshot

if TYPE_CHECKING:
    from gpuslice.agent.dra_driver import ClaimWarn, DriverSettings, Warn

log = get_logger("gpuslice.dra.driver")


@dataclass(slots=True)
class InFlight:
    """A claim being prepared: the devices it reserved before its first slow step (the
    overlap guard counts them), and what it changed so far, so a failure can undo it."""

    ref: ClaimRef
    uses: tuple[DeviceUse, ...]
    sharing: list[AppliedSharing]


class DriverState:
    """One per driver, shared by its pieces: the claims and their record, the locks, and
    what the node offers."""

    def __init__(
        self,
        settings: DriverSettings,
        *,
        snapshot: Callable[[], Snapshot | None],
        checkpoint: CheckpointFile,
        boot_id: str,
        dynamic_mig: DynamicMig | None,
        dynamic: Callable[[], Collection[str]],
    ) -> None:
        self.settings = settings
        self.snapshot = snapshot
        self.checkpoint = checkpoint
        """The record's file: written here only, read and kept aside by the record keeper."""
        self.boot_id = boot_id
        self.claims: dict[str, PreparedClaim] = {}
        self.complete = True
        """False while the record may lack claims still prepared (rebuilt without the API):
        written into the record, so the next start rebuilds again instead of cleaning up."""
        self.in_flight: dict[str, InFlight] = {}
        self.leaving: set[str] = set()
        """Claims being unprepared: their MPS daemons count as used by nobody, so of two
        claims of one daemon unprepared together (one kubelet call) the later stops it."""
        self.claim_locks = KeyedLocks()
        """Per claim UID: a repeated Prepare, or an Unprepare, waits for one in flight."""
        self.gpu_locks = KeyedLocks()
        """Per GPU UUID: starting and stopping a GPU's MPS daemons, setting its interval."""
        self._record_lock = asyncio.Lock()
        """Checkpoint writes, one at a time."""
        self._dynamic_mig = dynamic_mig
        self._dynamic = dynamic

    def holders(self) -> list[tuple[ClaimRef, tuple[DeviceUse, ...]]]:
        """Every prepared claim and every claim being prepared, with the devices it holds."""
        held = [(ClaimRef(c.namespace, c.uid, c.name), c.uses) for c in self.claims.values()]
        held.extend((flight.ref, flight.uses) for flight in self.in_flight.values())
        return held

    def gpu_indices(self) -> dict[str, int]:
        snap = self.snapshot()
        return {} if snap is None else {g.uuid: g.index for g in snap.inventory.gpus}

    def offer(self, snap: Snapshot) -> DraOffer:
        """The snapshot's DRA offer (`core.policy`), the one the publisher publishes: a
        dynamic MIG GPU's partitions included where this driver can make them."""
        if self._dynamic_mig is None:
            return snap.policy.offer(self.settings.consumable_shares)
        return snap.policy.offer(
            self.settings.consumable_shares, dynamic=self._dynamic(), ours=self._dynamic_mig.ours()
        )

    def completed(self, uid: str) -> PreparedClaim | None:
        done = self.claims.get(uid)
        return done if done is not None and done.state == "PrepareCompleted" else None

    async def write(self) -> None:
        """Write the record as it is now. Writes are serialized and each encodes the record
        when its turn comes, so the file ends as the newest state whatever the order of
        concurrent claims; a write once begun is finished even if its caller is cancelled
        (two writers of one file at once could leave either one's bytes last)."""
        await to_the_end(self._write_in_turn())

    async def _write_in_turn(self) -> None:
        async with self._record_lock:
            data = encode(Checkpoint(self.boot_id, dict(self.claims), self.complete))
            await asyncio.to_thread(self.checkpoint.write, data)

    async def write_quietly(self) -> None:
        try:
            await self.write()
        except OSError as exc:
            log.error("dra-checkpoint-write-failed", error=str(exc))


@dataclass(frozen=True, slots=True)
class DriverEvents:
    """Where the driver's Warning Events go: the node's (`warn`), and a claim's, in its
    namespace where its author looks (`claim_warn`; without it, to the node's). Posting
    never fails the driver: an unreachable API is logged."""

    warn: Warn | None
    claim_warn: ClaimWarn | None

    async def post_about(self, ref: ClaimRef, reason: str, message: str) -> None:
        if self.claim_warn is None:
            await self.post(reason, message)
            return
        try:
            await self.claim_warn(ref, reason, message)
        except Exception as exc:  # an unreachable API must not stop the driver
            log.warning("dra-event-failed", reason=reason, claim_uid=ref.uid, error=str(exc))

    async def post(self, reason: str, message: str) -> None:
        if self.warn is None:
            return
        try:
            await self.warn(reason, message)
        except Exception as exc:  # an unreachable API must not stop the driver
            log.warning("dra-event-failed", reason=reason, error=str(exc))


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _failed(ref: ClaimRef, error: str) -> PrepareResult:
    log.warning("dra-prepare-failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=error)
    return PrepareResult(error=error)
