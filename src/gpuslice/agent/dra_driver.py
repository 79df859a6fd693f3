"""The DRA driver's Prepare and Unprepare: the `ports.ClaimPreparer` behind `dra.sock`.

Prepare reads the claim (the kubelet sends only namespace, UID and name), lets the core
decide what it means on this node (`core.dra.claims`), refuses a device already prepared
for another claim (the driver is the last line of defence against a double allocation),
records `PrepareStarted`, applies the sharing (EXCLUSIVE_PROCESS on a whole GPU before its
MPS daemon, an MPS control daemon per MPS config group, one per shared GPU for MPS shares, a
time-slice interval when one is asked for), writes the claim's CDI spec and records
`PrepareCompleted` with what it returned. A repeated Prepare returns the recorded answer
without touching the node again; Unprepare undoes exactly what the record says, and
succeeds for a claim it never prepared.

Claims are independent: each is prepared on its own task, serialized only with work on the
same claim and, step by step, with work on the same GPU; devices are reserved before the
first slow step, so the overlap guard holds for claims still in flight. Every step has a
deadline, and so has each claim, all shorter than the kubelet's 45 s. A Prepare that fails
or is cancelled (the kubelet's deadline) is undone to its end before the cancellation goes
on, and its record is dropped: the checkpoint never holds a half-done claim as prepared.
Claim names are checked (`core.dra.names`) before anything is read or created for them.

The record survives restarts (`core.dra.prepared`): a file that does not decode is moved
aside and reported instead of crash-looping the agent, and a record from before a reboot
is dropped with every CDI spec it left, since nothing it describes exists any more. A
missing record means "nothing prepared" only on a node with no CDI spec and no MPS daemon
directory of this driver; otherwise it was lost (removed, kept under an earlier build's
name, the agent killed between moving a corrupt one aside and writing its rebuild) and is
rebuilt as a corrupt one is. A rebuild that could not read the API is recorded as
incomplete, so every later start rebuilds again and removes nothing until one can.

`DraDriver` is the facade: it owns the settings and the pieces it builds (drawn in
`agent.dra_state`), and answers the kubelet's adapter (`ports.ClaimPreparer`) and the agent
(the prepared claims, as a plan, the guard's modes, the devices, the caps), so callers see
one object while each piece is given only what it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.agent.cdi_base import BaseSpec
from gpuslice.agent.dra_prepare import Preparer
from gpuslice.agent.dra_record import RecordKeeper
from gpuslice.agent.dra_sharing import ClaimSharing
from gpuslice.agent.dra_state import DriverEvents, DriverState
from gpuslice.agent.dra_unprepare import Unpreparer
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.core.caps import ContainerCaps
from gpuslice.core.dra.claimplan import claim_resource, claims_plan, sharing_claims
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.dra.prepared import PreparedClaim
from gpuslice.core.dra.publish import REPLICAS, DraDevice, SharesMode
from gpuslice.core.sharing.model import Plan
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.logs import get_logger
from gpuslice.mps import MpsDaemonManager
from gpuslice.ports import ComputeModeSetter, DraObjects, TimesliceSetter
from gpuslice.state import Snapshot

log = get_logger("gpuslice.dra.driver")

KUBELET_CALL_TIMEOUT_S = 45.0
"""The kubelet's deadline for one NodePrepareResources call (`defaultClientCallTimeout`)."""

Warn = Callable[[str, str], Awaitable[None]]
"""Posts a Warning Event on the Node: (reason, message)."""
ClaimWarn = Callable[[ClaimRef, str, str], Awaitable[None]]
"""Posts a Warning Event about a ResourceClaim, in its namespace: (claim, reason, message)."""


@dataclass(frozen=True, slots=True)
class DriverSettings:
    driver: str
    node: str
    """The node's name: the pool every device of this node is published in."""
    mps_root: str
    """Where claim MPS daemons keep their pipe, log and shm directories."""
    consumable_shares: SharesMode = REPLICAS
    """Which devices are offered as shares, and how (what the publisher publishes)."""
    mps_ready_timeout_s: float = 10.0
    """How long Prepare waits for a new MPS daemon to answer before failing the claim."""
    api_timeout_s: float = 15.0
    """How long Prepare waits for the API to return a claim: an API server that hangs fails
    the claims concerned well within the kubelet's 45 s, and never holds the others."""
    timeslice_timeout_s: float = 10.0
    """How long setting (or resetting) one GPU's time-slice interval may take."""
    compute_mode_timeout_s: float = 10.0
    """How long setting (or resetting) one GPU's compute mode may take."""
    prepare_timeout_s: float = 30.0
    """One claim's whole Prepare, from the API read to the record. A claim whose steps
    together take longer is undone and gets its own error; the 15 s left of the kubelet's
    45 are for that undo, so the kubelet hears the claim's error, not its own deadline."""
    rebuild_timeout_s: float = 60.0
    """How long rebuilding a lost record may wait on the API: the cluster's claims, page by
    page, before the driver serves. Not bound by the kubelet's deadline (no call is
    waiting yet); a LIST that does not finish leaves the record incomplete, not wrong."""

    def __post_init__(self) -> None:
        for name in (
            "mps_ready_timeout_s",
            "api_timeout_s",
            "timeslice_timeout_s",
            "compute_mode_timeout_s",
            "prepare_timeout_s",
        ):
            value = getattr(self, name)
            if not 0 < value < KUBELET_CALL_TIMEOUT_S:
                raise ValueError(
                    f"DriverSettings.{name} {value!r} must be above 0 and below the "
                    f"kubelet's {KUBELET_CALL_TIMEOUT_S:g} s call deadline"
                )
        if not self.rebuild_timeout_s > 0:
            raise ValueError(
                f"DriverSettings.rebuild_timeout_s {self.rebuild_timeout_s!r} must be above 0"
            )


class DraDriver:
    """The driver as the kubelet's adapter and the agent see it: a facade over its pieces
    (`agent.dra_state`), which it builds, each with what it uses."""

    def __init__(
        self,
        settings: DriverSettings,
        *,
        objects: DraObjects,
        checkpoint: CheckpointFile,
        cdi: CdiSpecStore,
        snapshot: Callable[[], Snapshot | None],
        boot_id: str,
        mps: MpsDaemonManager | None = None,
        timeslice: TimesliceSetter | None = None,
        warn: Warn | None = None,
        claim_warn: ClaimWarn | None = None,
        old_checkpoint: CheckpointFile | None = None,
        dynamic_mig: DynamicMig | None = None,
        dynamic: Callable[[], Collection[str]] = frozenset,
        compute_mode: ComputeModeSetter | None = None,
        base: BaseSpec | None = None,
    ) -> None:
        """Where the device nodes are on the host is the snapshot's `host_dev_root`, read
        at each Prepare, so a config reload that moves the driver root counts.
        `old_checkpoint` is where an earlier build kept the record
        (`host.checkpoint_file.OLD_CHECKPOINT_NAME`): read, never written, when
        `checkpoint` holds nothing. `dynamic_mig` creates and destroys the MIG devices of
        the GPUs `dynamic` marks (`core.dra.partitions.is_dynamic`). `compute_mode` sets
        a whole GPU's compute mode around its MPS daemon as a step of the claim (None: the
        node leaves compute modes alone, `--no-compute-mode`); the MPS manager then sets
        none, so the claim's record is the one carrier of that change. `claim_warn` tells a
        claim's author what Prepare did not apply (about the claim, where its author looks);
        without it those warnings go to `warn` with the node's own. `base` writes the
        node's base CDI spec, whose ID each device then returns beside its claim's
        (`agent.cdi_base`); None: a node without the driver's files."""
        self.settings = settings
        self._state = DriverState(
            settings,
            snapshot=snapshot,
            checkpoint=checkpoint,
            boot_id=boot_id,
            dynamic_mig=dynamic_mig,
            dynamic=dynamic,
        )
        events = DriverEvents(warn, claim_warn)
        sharing = ClaimSharing(self._state, mps=mps, timeslice=timeslice, compute_mode=compute_mode)
        self._unpreparer = Unpreparer(self._state, sharing, cdi=cdi, dynamic_mig=dynamic_mig)
        self._preparer = Preparer(
            self._state,
            sharing,
            self._unpreparer,
            objects=objects,
            cdi=cdi,
            events=events,
            base=base,
            dynamic_mig=dynamic_mig,
            dynamic=dynamic,
        )
        self._records = RecordKeeper(
            self._state,
            sharing,
            self._unpreparer,
            self._preparer,
            objects=objects,
            cdi=cdi,
            old_checkpoint=old_checkpoint,
            events=events,
            base=base,
            dynamic_mig=dynamic_mig,
        )
        self.loaded = False
        """Whether the record is loaded: the driver serves from then on."""

    @property
    def caps(self) -> ContainerCaps | None:
        """Memory caps for the claims' CDI specs (`agent.caps`), set by the builder where
        the node can take them; None: no caps in the specs."""
        return self._preparer.caps

    @caps.setter
    def caps(self, caps: ContainerCaps | None) -> None:
        self._preparer.caps = caps

    async def load(self) -> None:
        """Read the record, or rebuild it (`agent.dra_record`), before the driver serves."""
        await self._records.load()
        self.loaded = True

    # -- what others read ------------------------------------------------------------------

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        return dict(self._state.claims)

    def claims_plan(self) -> Plan | None:
        """The prepared claims as a plan for attribution, the guard and the exporter."""
        snap = self._state.snapshot()
        if snap is None:
            return None
        return claims_plan(self._state.claims.values(), snap.inventory, self.settings.node)

    def guard_mode(self, resource: str) -> str | None:
        """A claim's GuardConfig mode by its plan resource (`claim:<ns>/<name>`)."""
        claim = self.claim_of(resource)
        return None if claim is None else claim.guard_mode

    def claim_of(self, resource: str) -> PreparedClaim | None:
        """The prepared claim behind a plan resource (`claim:<ns>/<name>`)."""
        for claim in self._state.claims.values():
            if claim_resource(claim.namespace, claim.name) == resource:
                return claim
        return None

    def sharing_claims(self) -> frozenset[str]:
        """Plan resources of the claims on a GPU shared with other claims or offered as
        shares (`core.dra.claimplan.sharing_claims`): the guard does not let them weaken it
        unless the node's admin allows it."""
        return frozenset(sharing_claims(self._state.claims.values()))

    def devices(self, snap: Snapshot) -> list[DraDevice]:
        """The node's devices as published (the health stream reports each)."""
        return list(self._state.offer(snap).devices)

    # -- ports.ClaimPreparer ---------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        # Each claim on its own task: a claim that waits on the API or on an MPS start holds
        # only itself (and the GPUs it works on), never the others of the batch or of other
        # pods. If the call is cancelled, gather waits for every claim's undo to finish.
        results = await asyncio.gather(*(self._preparer.prepare_claim(ref) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        results = await asyncio.gather(*(self._unpreparer.unprepare_claim(ref) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}
