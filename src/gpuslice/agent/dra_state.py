"""What the DRA driver's parts share: the claims prepared and in flight, the claims' MPS
daemons, the locks, the record's writer and the Events.

`agent.dra_driver.DraDriver` is built in layers, one module per concern, each a class on
the one below: this state, the claims' sharing on the node (`agent.dra_sharing`: MPS
daemons, compute modes, time-slice intervals and their undo), Prepare (`agent.dra_prepare`),
Unprepare (`agent.dra_unprepare`), the record's load and rebuild (`agent.dra_record`), and
the driver itself, which the kubelet's adapter and the agent call. The attributes are set
by `DraDriver.__init__`, which says what each holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.aio.keyed_locks import KeyedLocks
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.caps import ContainerCaps
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.dra.prepared import AppliedSharing, Checkpoint, DeviceUse, PreparedClaim, encode
from gpuslice.core.mps import MpsDaemonSpec
from gpuslice.core.policy import DraOffer
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.logs import get_logger
from gpuslice.mps import MpsDaemonManager
from gpuslice.ports import ComputeModeSetter, DraObjects, TimesliceSetter
from gpuslice.state import Snapshot

if TYPE_CHECKING:
    from gpuslice.agent.cdi_base import BaseSpec
    from gpuslice.agent.dra_driver import ClaimWarn, DriverSettings, Warn

log = get_logger("gpuslice.dra.driver")


@dataclass(slots=True)
class _InFlight:
    """A claim being prepared: the devices it reserved before its first slow step (the
    overlap guard counts them), and what it changed so far, so a failure can undo it."""

    ref: ClaimRef
    uses: tuple[DeviceUse, ...]
    sharing: list[AppliedSharing]


class DriverState:
    """The driver's state (set by `DraDriver.__init__`) and the helpers every part uses."""

    settings: DriverSettings
    _objects: DraObjects
    _checkpoint: CheckpointFile
    _old_checkpoint: CheckpointFile | None
    _complete: bool
    _cdi: CdiSpecStore
    _snapshot: Callable[[], Snapshot | None]
    _boot_id: str
    _mps: MpsDaemonManager | None
    _timeslice: TimesliceSetter | None
    _compute_mode: ComputeModeSetter | None
    _warn: Warn | None
    _claim_warn: ClaimWarn | None
    _claims: dict[str, PreparedClaim]
    _daemons: dict[str, MpsDaemonSpec]
    _in_flight: dict[str, _InFlight]
    _leaving: set[str]
    _claim_locks: KeyedLocks
    _gpu_locks: KeyedLocks
    caps: ContainerCaps | None
    _record_lock: asyncio.Lock
    _dynamic_mig: DynamicMig | None
    _dynamic: Callable[[], Collection[str]]
    _base: BaseSpec | None
    loaded: bool

    def _holders(self) -> list[tuple[ClaimRef, tuple[DeviceUse, ...]]]:
        """Every prepared claim and every claim being prepared, with the devices it holds."""
        held = [(ClaimRef(c.namespace, c.uid, c.name), c.uses) for c in self._claims.values()]
        held.extend((flight.ref, flight.uses) for flight in self._in_flight.values())
        return held

    def _gpu_indices(self) -> dict[str, int]:
        snap = self._snapshot()
        return {} if snap is None else {g.uuid: g.index for g in snap.inventory.gpus}

    def _offer(self, snap: Snapshot) -> DraOffer:
        """The snapshot's DRA offer (`core.policy`), the one the publisher publishes: a
        dynamic MIG GPU's partitions included where this driver can make them."""
        if self._dynamic_mig is None:
            return snap.policy.offer(self.settings.consumable_shares)
        return snap.policy.offer(
            self.settings.consumable_shares, dynamic=self._dynamic(), ours=self._dynamic_mig.ours()
        )

    def _completed(self, uid: str) -> PreparedClaim | None:
        done = self._claims.get(uid)
        return done if done is not None and done.state == "PrepareCompleted" else None

    async def _write(self) -> None:
        """Write the record as it is now. Writes are serialized and each encodes the record
        when its turn comes, so the file ends as the newest state whatever the order of
        concurrent claims; a write once begun is finished even if its caller is cancelled
        (two writers of one file at once could leave either one's bytes last)."""
        await to_the_end(self._write_in_turn())

    async def _write_in_turn(self) -> None:
        async with self._record_lock:
            data = encode(Checkpoint(self._boot_id, dict(self._claims), self._complete))
            await asyncio.to_thread(self._checkpoint.write, data)

    async def _write_quietly(self) -> None:
        try:
            await self._write()
        except OSError as exc:
            log.error("dra-checkpoint-write-failed", error=str(exc))

    async def _post_about(self, ref: ClaimRef, reason: str, message: str) -> None:
        if self._claim_warn is None:
            await self._post(reason, message)
            return
        try:
            await self._claim_warn(ref, reason, message)
        except Exception as exc:  # an unreachable API must not stop the driver
            log.warning("dra-event-failed", reason=reason, claim_uid=ref.uid, error=str(exc))

    async def _post(self, reason: str, message: str) -> None:
        if self._warn is None:
            return
        try:
            await self._warn(reason, message)
        except Exception as exc:  # an unreachable API must not stop the driver
            log.warning("dra-event-failed", reason=reason, error=str(exc))


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _failed(ref: ClaimRef, error: str) -> PrepareResult:
    log.warning("dra-prepare-failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=error)
    return PrepareResult(error=error)
