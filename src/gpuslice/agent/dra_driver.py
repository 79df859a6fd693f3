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
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuslice.agent.cdi_base import BaseSpec
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.aio.keyed_locks import KeyedLocks
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.caps import CapPolicy, GpuCapability
from gpuslice.core.cdi.hook import CdiCaps
from gpuslice.core.cdi.spec import CdiDevice, with_limits
from gpuslice.core.devices import Inventory, MigDevice
from gpuslice.core.dra.caps import claim_limits
from gpuslice.core.dra.cdispec import cdi_id, claim_spec
from gpuslice.core.dra.claimplan import claim_resource, claims_plan, sharing_claims
from gpuslice.core.dra.claims import ClaimError, ClaimWork, claim_work, daemon_spec
from gpuslice.core.dra.kubelet_api import ClaimRef, PreparedDevice, PrepareResult
from gpuslice.core.dra.names import BadName, check_claim_ref, check_path_component
from gpuslice.core.dra.partitions import dynamic_gpus, node_devices, not_offered
from gpuslice.core.dra.preparation import (
    SHARES_RECORD,
    Preparation,
    SetComputeMode,
    SetInterval,
    StartDaemon,
    preparation,
    share_daemon_spec,
    with_compute_modes,
)
from gpuslice.core.dra.prepared import (
    AppliedSharing,
    Checkpoint,
    Decoded,
    DeviceUse,
    PreparedClaim,
    decode,
    encode,
)
from gpuslice.core.dra.publish import (
    REPLICAS,
    DraDevice,
    SharesMode,
    dra_devices,
    share_offers,
)
from gpuslice.core.dra.resource_claim import ResourceClaim
from gpuslice.core.mps import MpsDaemonSpec, control_socket_too_long
from gpuslice.core.protection import unreserved_memory
from gpuslice.core.sharing.model import PhysicalDevice, Plan
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile, CheckpointUnreadable, boot_time
from gpuslice.logs import get_logger
from gpuslice.mps import MpsDaemonManager, MpsError
from gpuslice.mps.control import PID_FILE, process_alive
from gpuslice.mps.identity import IdentityError, read_pid_file
from gpuslice.mps.shm import unmount
from gpuslice.ports import ComputeModeSetter, DraObjectNotFound, DraObjects, TimesliceSetter
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


@dataclass(slots=True)
class _InFlight:
    """A claim being prepared: the devices it reserved before its first slow step (the
    overlap guard counts them), and what it changed so far, so a failure can undo it."""

    ref: ClaimRef
    uses: tuple[DeviceUse, ...]
    sharing: list[AppliedSharing]


@dataclass(frozen=True, slots=True)
class DraCaps:
    """What a front end hands containers of memory caps: each GPU's capability, the policy,
    and how to call the toolkit's hook (None: the agent applies the limits after the
    container starts). A callable is asked at each use (Prepare, Allocate), so what changes
    while the agent runs is seen: a hook program installed or removed
    (`agent.caps.HookProgram.cdi`), a GPU refused or failing NVML since start
    (`agent.caps.CapsApplier.hook_capabilities`)."""

    capabilities: Mapping[str, GpuCapability] | Callable[[], Mapping[str, GpuCapability]]
    policy: CapPolicy
    hook: CdiCaps | Callable[[], CdiCaps | None] | None

    def gpus(self) -> Mapping[str, GpuCapability]:
        """Each GPU's capability now."""
        return self.capabilities() if callable(self.capabilities) else self.capabilities

    def cdi(
        self,
        devices: Sequence[CdiDevice],
        uses: Sequence[DeviceUse],
        inventory: Inventory,
        unreserved: Mapping[str, int] | None = None,
    ) -> tuple[tuple[CdiDevice, ...], CdiCaps | None]:
        """`unreserved`: GPU UUID -> memory no prepared share reserved (the hard limit of a
        share that reserved none, `core.protection.unreserved_memory`)."""
        physicals: dict[str, PhysicalDevice] = {
            g.uuid: PhysicalDevice.of_gpu(g) for g in inventory.gpus
        }
        limits = claim_limits(uses, physicals, self.gpus(), self.policy, unreserved)
        hook = self.hook() if callable(self.hook) else self.hook
        return with_limits(devices, limits), hook


class DraDriver:
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
        self._objects = objects
        self._checkpoint = checkpoint
        self._old_checkpoint = old_checkpoint
        self._complete = True
        """False while the record may lack claims still prepared (rebuilt without the API):
        written into the record, so the next start rebuilds again instead of cleaning up."""
        self._cdi = cdi
        self._snapshot = snapshot
        self._boot_id = boot_id
        self._mps = mps
        self._timeslice = timeslice
        self._compute_mode = compute_mode
        self._warn = warn
        self._claim_warn = claim_warn
        self._claims: dict[str, PreparedClaim] = {}
        self._daemons: dict[str, MpsDaemonSpec] = {}
        self._in_flight: dict[str, _InFlight] = {}
        self._leaving: set[str] = set()
        """Claims being unprepared: their MPS daemons count as used by nobody, so of two
        claims of one daemon unprepared together (one kubelet call) the later stops it."""
        self._claim_locks = KeyedLocks()
        """Per claim UID: a repeated Prepare, or an Unprepare, waits for one in flight."""
        self._gpu_locks = KeyedLocks()
        """Per GPU UUID: starting and stopping a GPU's MPS daemons, setting its interval."""
        self.caps: DraCaps | None = None
        """Memory caps for the claims' CDI specs (`agent.caps`), set by the builder where
        the node can take them; None: no caps in the specs."""
        self._record_lock = asyncio.Lock()
        """Checkpoint writes, one at a time."""
        self._dynamic_mig = dynamic_mig
        self._dynamic = dynamic
        self._base = base
        self.loaded = False

    # -- what others read ------------------------------------------------------------------

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        return dict(self._claims)

    def claims_plan(self) -> Plan | None:
        """The prepared claims as a plan for attribution, the guard and the exporter."""
        snap = self._snapshot()
        if snap is None:
            return None
        return claims_plan(self._claims.values(), snap.inventory, self.settings.node)

    def guard_mode(self, resource: str) -> str | None:
        """A claim's GuardConfig mode by its plan resource (`claim:<ns>/<name>`)."""
        claim = self.claim_of(resource)
        return None if claim is None else claim.guard_mode

    def claim_of(self, resource: str) -> PreparedClaim | None:
        """The prepared claim behind a plan resource (`claim:<ns>/<name>`)."""
        for claim in self._claims.values():
            if claim_resource(claim.namespace, claim.name) == resource:
                return claim
        return None

    def sharing_claims(self) -> frozenset[str]:
        """Plan resources of the claims on a GPU shared with other claims or offered as
        shares (`core.dra.claimplan.sharing_claims`): the guard does not let them weaken it
        unless the node's admin allows it."""
        return frozenset(sharing_claims(self._claims.values()))

    # -- start -----------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the record; drop what a reboot or a half-done Prepare left behind. A record
        that cannot be read, whatever is at its path, is kept aside and rebuilt from what
        the node and the API still say; the driver serves in every case."""
        raw: bytes | None = None
        if self._base is not None:  # before any Prepare, and what a rebuilt record returns
            await self._base.cdi_id(self._snapshot())
        if self._dynamic_mig is not None:
            # first: a rebuild of the DRA record must know which MIG devices are ours
            await self._dynamic_mig.read()
        try:
            raw = await asyncio.to_thread(self._checkpoint.read)
            decoded = decode(raw, self._boot_id)
        except CheckpointUnreadable as exc:
            decoded = Decoded("corrupt", Checkpoint(self._boot_id), str(exc))
        complete = True
        """Whether every prepared claim is known: what is not may then be cleaned up."""
        rebuilt = True
        if decoded.status == "corrupt":
            claims, complete = await self._recover(decoded.reason)
        elif decoded.status == "empty":
            claims, complete, rebuilt = await self._without_record()
        elif decoded.status == "ok" and not decoded.checkpoint.complete:
            claims, complete = await self._complete_record(decoded.checkpoint.claims)
        else:
            if decoded.status == "stale":
                log.warning("dra-checkpoint-stale", reason=decoded.reason)
            claims = dict(decoded.checkpoint.claims)
            rebuilt = False
        self._complete = complete
        if self._compute_mode is not None:
            # records from before the compute mode was a step: their daemons' GPUs were set
            claims = {
                u: replace(c, applied=with_compute_modes(c.applied)) for u, c in claims.items()
            }
        unfinished = [c for c in claims.values() if c.state != "PrepareCompleted"]
        for claim in unfinished:
            log.warning("dra-prepare-unfinished", claim=f"{claim.namespace}/{claim.name}")
            del claims[claim.uid]
        self._claims = claims
        # CDI specs of claims not (or no longer) prepared: a reboot, a crash mid-Prepare.
        for uid in await asyncio.to_thread(self._cdi.claims) if complete else ():
            if uid not in claims:
                await asyncio.to_thread(self._cdi.remove, uid)
                log.info("dra-cdi-orphan-removed", claim_uid=uid)
        for claim in claims.values():
            for applied in claim.applied:
                spec = self._spec_of(claim, applied)
                if spec is not None:
                    self._daemons[spec.resource] = spec
        if decoded.status != "ok" or raw is None or rebuilt:
            await self._write_quietly()
        for claim in unfinished:
            # a Prepare cut short by a crash: undo what its planned steps may have done (its
            # MPS daemon quit, the GPU's compute mode and time-slice interval reset)
            await self._undo(claim.uid, claim.applied)
        if self._mps is not None:
            if complete:
                await self._quit_strays()
            if self._daemons:
                await self._mps.reconfigure(self._daemons.values())
        if self._dynamic_mig is not None:
            # after the record: the instances of claims not prepared go, those of prepared
            # claims stay; with the record incomplete nothing is destroyed
            snap = self._snapshot()
            await self._dynamic_mig.reconcile(
                set(claims) if complete else None,
                [(c.uid, u.device, u.physical_uuid) for c in claims.values() for u in c.uses],
                # the dynamic GPUs: a static MIG device is never rebuilt as one made here
                list(dynamic_gpus(snap.inventory, self._dynamic())) if snap is not None else [],
            )
        self.loaded = True
        log.info(
            "dra-checkpoint-loaded", claims=len(claims), status=decoded.status, complete=complete
        )

    async def _without_record(self) -> tuple[dict[str, PreparedClaim], bool, bool]:
        """No file at the record's path: a first start, or a record lost. Only the node
        tells them apart: with no CDI spec and no MPS daemon directory of this driver there
        is nothing to lose; otherwise the record is rebuilt (with what an earlier build
        kept under the old name, when that is ours). The claims, whether they are all
        known, and whether anything was rebuilt."""
        path = self._checkpoint.path
        old = await self._old_record()
        specs = await asyncio.to_thread(self._cdi.claims)
        dirs = await asyncio.to_thread(self._daemon_dirs)
        if old is None and not specs and not dirs:
            return {}, True, False
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
            return claims, complete, True
        message = (
            f"DRA checkpoint {path} is missing while {len(specs)} CDI spec(s) and "
            f"{len(dirs)} MPS daemon director(ies) of this driver are on the node. "
            f"Rebuilt {len(claims)} prepared claim(s) {why}"
        )
        log.error("dra-checkpoint-missing", message=message)
        await self._post("CheckpointMissing", message)
        return claims, complete, True

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
        decoded = decode(raw, self._boot_id)
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
                f"DRA checkpoint {self._checkpoint.path} was rebuilt while the API could not "
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
        path = self._checkpoint.path
        try:
            kept = await asyncio.to_thread(self._checkpoint.quarantine)
            where = f"kept as {kept}" if kept is not None else "gone before it could be kept"
        except OSError as exc:
            where = f"could not be moved aside ({exc}); records cannot be written until it is"
        claims, complete, why = await self._rebuild({})
        message = (
            f"DRA checkpoint {path} could not be used ({reason}); {where}. "
            f"Rebuilt {len(claims)} prepared claim(s) {why}"
        )
        log.error("dra-checkpoint-corrupt", message=message)
        await self._post("CheckpointCorrupt", message)
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
                self._objects.list_claims(missing), self.settings.rebuild_timeout_s
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
            work = self._work(read, ref)
            prepared = preparation(work, self.settings.mps_root)
        except (BadName, ClaimError) as exc:
            log.warning("dra-rebuild-skipped", claim_uid=read.uid, error=str(exc))
            return None
        guard = next((d.sharing.guard_mode for d in work.devices if d.sharing.guard_mode), None)
        return PreparedClaim(
            ref.uid,
            ref.namespace,
            ref.name,
            "PrepareCompleted",
            devices=self._prepared_devices(work, None if self._base is None else self._base.last),
            applied=tuple(step.record for step in prepared.steps),
            uses=prepared.uses,
            guard_mode=guard,
        )

    async def _quit_strays(self) -> None:
        """Daemons are left running across agent restarts; one whose claim the record no
        longer holds (a corrupt record, a Prepare cut short) would serve nobody forever."""
        assert self._mps is not None
        for key in await asyncio.to_thread(self._daemon_dirs):
            if key not in self._daemons:
                await self._mps.quit_stray(daemon_spec(key, self.settings.mps_root, []))

    def _daemon_dirs(self) -> list[str]:
        """The claim MPS daemon directories (`<mps root>/<key>/pipe`) on the node."""
        root = Path(self.settings.mps_root)
        try:
            return sorted(p.name for p in root.iterdir() if (p / "pipe").is_dir())
        except FileNotFoundError:
            return []

    def _served(self, spec: MpsDaemonSpec, *, without: str = "") -> MpsDaemonSpec:
        """A share daemon sized by every share on its GPU, of the claims prepared or being
        prepared (but `without` and those leaving), as `share_daemon_spec` says; any other
        daemon as it is."""
        if not spec.retunable:
            return spec
        uses = [
            u
            for ref, held in self._holders()
            if ref.uid != without and ref.uid not in self._leaving
            for u in held
        ]
        snap = self._snapshot()
        gpu = None if snap is None else snap.inventory.gpu_by_uuid(spec.gpu_uuids[0])
        memory = None if gpu is None else gpu.memory_mib or None
        return share_daemon_spec(
            self.settings.mps_root, spec.gpu_uuids[0], spec.gpu_indices[0], uses, memory
        )

    def _spec_of(self, claim: PreparedClaim, applied: AppliedSharing) -> MpsDaemonSpec | None:
        if not applied.mps_key:
            return None
        indices = self._gpu_indices()
        gpus = [(u, indices[u]) for u in applied.gpu_uuids if u in indices]
        if not gpus:
            return None
        if applied.strategy == SHARES_RECORD:
            uuid, index = gpus[0]
            return self._served(share_daemon_spec(self.settings.mps_root, uuid, index, ()))
        return daemon_spec(
            applied.mps_key,
            self.settings.mps_root,
            gpus,
            thread_percentage=applied.thread_percentage,
            limits_mib=dict(applied.limits_mib),
            mig_uuids=applied.mig_uuids,
            multi_user=applied.multi_user,
        )

    def _gpu_indices(self) -> dict[str, int]:
        snap = self._snapshot()
        return {} if snap is None else {g.uuid: g.index for g in snap.inventory.gpus}

    # -- ports.ClaimPreparer ---------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        # Each claim on its own task: a claim that waits on the API or on an MPS start holds
        # only itself (and the GPUs it works on), never the others of the batch or of other
        # pods. If the call is cancelled, gather waits for every claim's undo to finish.
        results = await asyncio.gather(*(self._prepare_claim(ref) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        results = await asyncio.gather(*(self._unprepare_claim(ref) for ref in claims))
        return {ref.uid: result for ref, result in zip(claims, results, strict=True)}

    # -- prepare ---------------------------------------------------------------------------

    def _completed(self, uid: str) -> PreparedClaim | None:
        done = self._claims.get(uid)
        return done if done is not None and done.state == "PrepareCompleted" else None

    async def _prepare_claim(self, ref: ClaimRef) -> PrepareResult:
        """One claim, within its time budget; whatever goes wrong is this claim's error."""
        try:
            check_claim_ref(ref)  # before anything is read or created for it
        except BadName as exc:
            return _failed(ref, f"refused: {exc}")
        budget = self.settings.prepare_timeout_s
        try:
            async with asyncio.timeout(budget):
                return await self._prepare_in_time(ref)
        except TimeoutError:
            return _failed(
                ref,
                f"ResourceClaim {ref.namespace}/{ref.name}: not prepared within {budget:g} s; "
                "what was started for it is undone",
            )
        except Exception as exc:  # a bug: this claim's error, never the batch's
            log.exception("dra-prepare-crashed", claim=f"{ref.namespace}/{ref.name}")
            return _failed(ref, f"ResourceClaim {ref.namespace}/{ref.name}: {_described(exc)}")

    async def _prepare_in_time(self, ref: ClaimRef) -> PrepareResult:
        done = self._completed(ref.uid)
        if done is not None:
            return PrepareResult(done.devices)  # the kubelet asks again after its restart
        # Read outside the claim's lock: a slow API server delays only this claim.
        claim = await self._read_claim(ref)
        async with self._claim_locks.holding([ref.uid]):
            done = self._completed(ref.uid)
            if done is not None:  # a Prepare of the same claim finished while this one read
                return PrepareResult(done.devices)
            if isinstance(claim, str):
                return _failed(ref, claim)
            try:
                made = await self._materialize(claim, ref)
                work = self._work(claim, ref, made)
                prepared = preparation(work, self.settings.mps_root)
                self._reserve(work, prepared.uses)
            except ClaimError as exc:
                await self._release(ref)
                return _failed(ref, str(exc))
            try:
                for notice in work.notices:  # the claim is prepared, on the node's terms
                    await self._post_about(ref, "ClaimConfigNotApplied", notice)
                return await self._carry_out(work, prepared)
            finally:
                del self._in_flight[ref.uid]

    async def _carry_out(self, work: ClaimWork, prepared: Preparation) -> PrepareResult:
        """Record `PrepareStarted`, apply, write the CDI spec, record `PrepareCompleted`; on
        any failure or cancellation, undo what was applied and drop the record entirely."""
        ref = work.ref
        applied = self._in_flight[ref.uid].sharing
        # the planned steps go into the record first: a crash mid-way leaves a record that
        # says what may have taken effect, and the next start undoes it (`load`)
        planned = tuple(step.record for step in prepared.steps)
        started = PreparedClaim(ref.uid, ref.namespace, ref.name, "PrepareStarted", applied=planned)
        try:
            self._claims[ref.uid] = started
            await self._write()
            await self._apply(prepared, applied)
            snap = self._snapshot()
            base = None if self._base is None else await self._base.cdi_id(snap)
            devices = self._prepared_devices(work, base)
            dev_root = "/" if snap is None else snap.host_dev_root
            cdi, hook = prepared.cdi, None
            if self.caps is not None and snap is not None:
                others = claims_plan(self._claims.values(), snap.inventory, self.settings.node)
                free = unreserved_memory(others)
                cdi, hook = self.caps.cdi(prepared.cdi, prepared.uses, snap.inventory, free)
            spec = claim_spec(
                ref.uid, cdi, host_dev_root=dev_root, caps=hook, driver_from_base=base is not None
            )
            await to_the_end(asyncio.to_thread(self._cdi.write, ref.uid, spec))
            guard = next((d.sharing.guard_mode for d in work.devices if d.sharing.guard_mode), None)
            self._claims[ref.uid] = replace(
                started,
                state="PrepareCompleted",
                devices=devices,
                applied=tuple(applied),
                uses=prepared.uses,
                guard_mode=guard,
            )
            await self._write()
        except BaseException as exc:  # CancelledError too: the kubelet's deadline, a shutdown
            await to_the_end(self._abandon(ref, list(applied)))
            if not isinstance(exc, Exception):
                log.warning("dra-prepare-cancelled", claim=f"{ref.namespace}/{ref.name}")
                raise
            if not isinstance(exc, ClaimError | MpsError | OSError | ValueError):
                log.exception("dra-prepare-crashed", claim=f"{ref.namespace}/{ref.name}")
            if isinstance(exc, ClaimError | MpsError):
                return _failed(ref, str(exc))
            return _failed(ref, f"ResourceClaim {ref.namespace}/{ref.name}: {_described(exc)}")
        log.info(
            "dra-prepared",
            claim=f"{ref.namespace}/{ref.name}",
            uid=ref.uid,
            devices=",".join(d.device for d in devices),
        )
        return PrepareResult(devices)

    async def _abandon(self, ref: ClaimRef, applied: Sequence[AppliedSharing]) -> None:
        await self._undo(ref.uid, applied)
        self._claims.pop(ref.uid, None)
        await self._write_quietly()
        await self._release(ref)
        log.info("dra-prepare-undone", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)

    async def _read_claim(self, ref: ClaimRef) -> ResourceClaim | str:
        """The claim from the API, read into what Prepare uses, or why it could not be read."""
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        try:
            return ResourceClaim.read(
                await asyncio.wait_for(
                    self._objects.get_claim(ref.namespace, ref.name), self.settings.api_timeout_s
                )
            )
        except DraObjectNotFound:
            return f"{where} not found in the API (deleted?)"
        except TimeoutError:
            return (
                f"reading {where}: no answer from the API within {self.settings.api_timeout_s:g} s"
            )
        except Exception as exc:
            return f"reading {where}: {exc}"

    def devices(self, inventory: Inventory) -> list[DraDevice]:
        """The node's devices as published (the health stream reports each)."""
        return list(self._devices(inventory).values())

    def _devices(self, inventory: Inventory) -> dict[str, DraDevice]:
        """The node's devices by name, as the publisher publishes them: a dynamic MIG GPU's
        partitions included (`core.dra.partitions`)."""
        static = dra_devices(inventory)
        if self._dynamic_mig is None:
            return {d.name: d for d in static}
        dyn = dynamic_gpus(inventory, self._dynamic(), self._dynamic_mig.ours())
        return {d.name: d for d in node_devices(static, dyn)}

    async def _materialize(self, claim: ResourceClaim, ref: ClaimRef) -> dict[str, MigDevice]:
        """Create the MIG devices of the claim's dynamic MIG partitions that do not exist
        yet (`agent.dynamic_mig`): device name -> the MIG device. ClaimError when one
        cannot be made."""
        snap = self._snapshot()
        if self._dynamic_mig is None or snap is None:
            return {}
        inventory = snap.inventory
        ours = self._dynamic_mig.ours()
        dyn = dynamic_gpus(inventory, self._dynamic(), ours)
        parts = {name: p for d in dyn.values() for name, p in d.partitions.items()}
        allocated = _allocated(claim, self.settings.driver, self.settings.node)
        for name in allocated:  # before anything is created: the whole claim is refused
            why = None if name in parts else not_offered(name, inventory, self._dynamic(), ours)
            if why is not None:
                raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: {why}")
        made: dict[str, MigDevice] = {}
        try:
            for name in allocated:
                part = parts.get(name)
                if part is not None:
                    made[name] = await self._dynamic_mig.materialize(ref.uid, part)
        except ClaimError:
            raise  # the caller releases what was made
        except BaseException as exc:  # a record that cannot be written, a cancellation
            await self._release(ref)
            if not isinstance(exc, Exception):
                raise
            raise ClaimError(
                f"ResourceClaim {ref.namespace}/{ref.name}: creating its MIG devices: "
                f"{_described(exc)}"
            ) from None
        return made

    async def _release(self, ref: ClaimRef) -> str:
        """Destroy the MIG devices created for the claim; "" or why not."""
        if self._dynamic_mig is None:
            return ""
        error = await to_the_end(self._dynamic_mig.release(ref.uid))
        if error:
            log.error(
                "dra-dynamic-mig-release-failed", claim=f"{ref.namespace}/{ref.name}", error=error
            )
        return error

    def _work(
        self,
        claim: ResourceClaim,
        ref: ClaimRef,
        made: Mapping[str, MigDevice] | None = None,
    ) -> ClaimWork:
        """`made`: MIG devices just created for the claim, which the inventory read before
        their creation does not list yet."""
        snap = self._snapshot()
        if snap is None:
            raise ClaimError("the driver has not read this node's GPUs yet")
        devices = self._devices(snap.inventory)
        for name, mig in (made or {}).items():
            if name in devices:
                devices[name] = replace(devices[name], uuid=mig.uuid, mig=mig)
        by_uuid = share_offers(snap.plan, self.settings.consumable_shares, devices.values())
        offers = {name: by_uuid[d.uuid] for name, d in devices.items() if d.uuid in by_uuid}
        return claim_work(
            claim,
            ref,
            driver=self.settings.driver,
            pool=self.settings.node,
            devices=devices,
            offers=offers,
        )

    def _reserve(self, work: ClaimWork, uses: tuple[DeviceUse, ...]) -> None:
        """Check the overlap guard and reserve the claim's devices in one step (no await in
        between), so two concurrent Prepares cannot both take one device."""
        self._check_overlap(work)
        self._in_flight[work.ref.uid] = _InFlight(work.ref, uses, [])

    def _holders(self) -> list[tuple[ClaimRef, tuple[DeviceUse, ...]]]:
        """Every prepared claim and every claim being prepared, with the devices it holds."""
        held = [(ClaimRef(c.namespace, c.uid, c.name), c.uses) for c in self._claims.values()]
        held.extend((flight.ref, flight.uses) for flight in self._in_flight.values())
        return held

    def _check_overlap(self, work: ClaimWork) -> None:
        """Two claims never hold the same device, unless both hold shares of it or one
        holds it through adminAccess."""
        holders = self._holders()
        for dw in work.devices:
            for other, uses in holders:
                if other.uid == work.ref.uid:
                    continue
                for use in uses:
                    if use.device != dw.device.name or dw.admin or use.admin:
                        continue  # adminAccess reaches devices others hold, by design
                    if dw.share_id is not None and use.share_id is not None:
                        continue
                    raise ClaimError(
                        f"ResourceClaim {work.ref.namespace}/{work.ref.name}: device "
                        f"{dw.device.name} is already prepared for ResourceClaim "
                        f"{other.namespace}/{other.name} (UID {other.uid})"
                    )

    def _prepared_devices(self, work: ClaimWork, base: str | None) -> tuple[PreparedDevice, ...]:
        """Each device's CDI IDs: the base spec's first where there is one, as NVIDIA's
        driver returns its standard spec's (`core.cdi.driver`)."""
        first = () if base is None else (base,)
        return tuple(
            PreparedDevice(
                request_names=(dw.request_name,),
                pool=self.settings.node,
                device=dw.device.name,
                cdi_ids=(*first, cdi_id(work.ref.uid, dw.device.name)),
                share_id=dw.share_id,
            )
            for dw in work.devices
        )

    async def _apply(self, prepared: Preparation, applied: list[AppliedSharing]) -> None:
        """Carry out the claim's steps in order, each under the locks of the GPUs it
        touches, keeping each one's record once it may have taken effect."""
        for step in prepared.steps:
            if isinstance(step, StartDaemon):
                async with self._gpu_locks.holding(step.spec.gpu_uuids):
                    # recorded first: a daemon that never answers is still one to stop
                    applied.append(step.record)
                    await self._start_daemon(self._served(step.spec))
            elif isinstance(step, SetComputeMode):
                async with self._gpu_locks.holding([step.gpu_uuid]):
                    await self._set_exclusive(step, applied)
            else:
                async with self._gpu_locks.holding([step.gpu_uuid]):
                    await self._set_interval(step, applied)

    async def _set_interval(self, step: SetInterval, applied: list[AppliedSharing]) -> None:
        if self._timeslice is None:
            raise ClaimError(
                f"{step.source}: this node cannot set time-slice intervals "
                "(no nvidia-smi configured); remove timeSlicingConfig.interval"
            )
        timeout = self.settings.timeslice_timeout_s
        applied.append(step.record)  # a set cut short may have taken effect: reset it then
        try:
            await asyncio.wait_for(
                self._timeslice.set_timeslice(step.gpu_uuid, step.interval), timeout
            )
        except MpsError as exc:
            applied.pop()  # nvidia-smi refused: nothing to reset
            raise ClaimError(
                f"{step.source}: GPU {step.gpu_uuid} does not take time-slice interval "
                f"{step.interval}: {exc}"
            ) from None
        except TimeoutError:
            raise ClaimError(
                f"{step.source}: setting time-slice interval {step.interval} on GPU "
                f"{step.gpu_uuid} did not finish within {timeout:g} s"
            ) from None

    async def _set_exclusive(self, step: SetComputeMode, applied: list[AppliedSharing]) -> None:
        """EXCLUSIVE_PROCESS before the GPU's MPS daemon starts, recorded before it is set
        (a crash in between leaves a record the next start undoes). MPS works without it,
        as NVIDIA's driver has it: a refusal is told, and the claim goes on."""
        if self._compute_mode is None:
            return
        applied.append(step.record)
        try:
            await asyncio.wait_for(
                self._compute_mode.set_mode(step.gpu_uuid, "EXCLUSIVE_PROCESS"),
                self.settings.compute_mode_timeout_s,
            )
        except (MpsError, TimeoutError) as exc:
            if isinstance(exc, MpsError):
                applied.pop()  # nvidia-smi refused: nothing to reset
            log.warning(
                "dra-compute-mode-not-set",
                gpu=step.gpu_uuid,
                error=_described(exc),
                effect="MPS runs without it; another process may open the GPU",
            )

    async def _reset_compute_mode(self, gpu_uuid: str) -> None:
        assert self._compute_mode is not None
        try:
            await asyncio.wait_for(
                self._compute_mode.set_mode(gpu_uuid, "DEFAULT"),
                self.settings.compute_mode_timeout_s,
            )
        except (MpsError, TimeoutError) as exc:
            log.warning("dra-compute-mode-reset-failed", gpu=gpu_uuid, error=_described(exc))
        else:
            log.info("dra-compute-mode-reset", gpu=gpu_uuid)

    async def _start_daemon(self, spec: MpsDaemonSpec) -> None:
        if self._mps is None:
            raise ClaimError("MPS is not available on this node (no MPS control program)")
        if problem := control_socket_too_long(spec.pipe_dir):
            raise ClaimError(problem)
        if self._daemons.get(spec.resource) != spec:
            self._daemons[spec.resource] = spec
            await to_the_end(self._mps.reconfigure(tuple(self._daemons.values())))
        await self._wait_ready(spec.resource)

    async def _wait_ready(self, key: str) -> None:
        assert self._mps is not None
        timeout = self.settings.mps_ready_timeout_s
        deadline = time.monotonic() + timeout
        version = self._mps.version
        while not self._mps.ready(key):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                problems = "; ".join(self._mps.problems[-2:])
                raise ClaimError(
                    f"MPS control daemon {key} did not answer within {timeout:g} s"
                    + (f" ({problems})" if problems else "")
                )
            try:
                version = await asyncio.wait_for(self._mps.wait_changed(version), remaining)
            except TimeoutError:
                continue

    # -- unprepare -------------------------------------------------------------------------

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

    async def _undo(self, claim_uid: str, applied: Sequence[AppliedSharing]) -> None:
        """Undo what the record says, best effort: a step that fails is logged, never
        blocks the rest (the claim is gone for the kubelet either way). Runs under the
        locks of every GPU it touches, so a claim starting a daemon on one of them either
        finished (and keeps the daemon) or starts after the stop.

        A daemon of the claim's that no one supervises (its Prepare was cut short by a
        crash) is quit here, and the GPUs' compute modes are reset after the daemons went.
        While the record is incomplete, a GPU's share daemon and compute mode may serve a
        claim the record lacks: only the claim's own daemons and their GPUs are undone."""
        gpus = [u for a in applied for u in a.gpu_uuids]
        async with self._gpu_locks.holding(gpus):
            still_used = self._daemons_used_by_others(claim_uid)
            stopped: list[str] = []
            strays: list[str] = []
            retuned = False
            for a in applied:
                if a.mps_key and a.mps_key not in still_used:
                    if a.mps_key in self._daemons:
                        del self._daemons[a.mps_key]
                        stopped.append(a.mps_key)
                    elif a.mps_key not in strays and self._undoable(claim_uid, a.mps_key):
                        strays.append(a.mps_key)
                elif a.mps_key in self._daemons and self._daemons[a.mps_key].retunable:
                    # the shares left on the GPU may hold less than this one did
                    spec = self._served(self._daemons[a.mps_key], without=claim_uid)
                    retuned = retuned or spec != self._daemons[a.mps_key]
                    self._daemons[a.mps_key] = spec
                if a.interval is not None and a.interval != 0 and self._timeslice is not None:
                    for uuid in a.gpu_uuids:
                        await self._reset_interval(uuid)
            if self._mps is not None:
                if stopped or retuned:
                    await self._mps.reconfigure(tuple(self._daemons.values()))
                for key in strays:
                    await self._mps.quit_stray(daemon_spec(key, self.settings.mps_root, []))
            # after the daemons: the mode goes back once no MPS server holds the GPU
            if self._compute_mode is not None:
                keep = self._exclusive_for_others(claim_uid)
                if not self._complete:
                    own = {
                        u
                        for a in applied
                        if self._undoable(claim_uid, a.mps_key)
                        for u in a.gpu_uuids
                    }
                    keep |= set(gpus) - own
                for uuid in dict.fromkeys(
                    u for a in applied if a.compute_mode for u in a.gpu_uuids
                ):
                    if uuid not in keep:
                        await self._reset_compute_mode(uuid)
            for key in (*stopped, *strays):
                await asyncio.to_thread(self._remove_daemon_dir, key)
        try:
            await asyncio.to_thread(self._cdi.remove, claim_uid)
        except (OSError, ValueError) as exc:
            log.warning("dra-cdi-remove-failed", claim_uid=claim_uid, error=str(exc))

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

    def _daemons_used_by_others(self, claim_uid: str) -> set[str]:
        used = {
            a.mps_key
            for uid, c in self._claims.items()
            if uid != claim_uid and uid not in self._leaving
            for a in c.applied
            if a.mps_key
        }
        used.update(
            a.mps_key
            for uid, flight in self._in_flight.items()
            if uid != claim_uid
            for a in flight.sharing
            if a.mps_key
        )
        return used

    def _undoable(self, claim_uid: str, mps_key: str) -> bool:
        """Whether the daemon `mps_key` serves no claim but `claim_uid`'s, as far as the
        record can tell: its own (`<uid>-<digest>`), or any while the record is complete."""
        return bool(mps_key) and (self._complete or mps_key.startswith(f"{claim_uid}-"))

    def _exclusive_for_others(self, claim_uid: str) -> set[str]:
        """GPUs another claim (prepared, or being prepared) set to EXCLUSIVE_PROCESS: MPS
        shares of one GPU share its daemon, and the mode stays until the last one goes."""
        applied = [
            a
            for uid, c in self._claims.items()
            if uid != claim_uid and uid not in self._leaving
            for a in c.applied
        ]
        applied.extend(
            a for uid, flight in self._in_flight.items() if uid != claim_uid for a in flight.sharing
        )
        return {u for a in applied if a.compute_mode for u in a.gpu_uuids}

    async def _reset_interval(self, gpu_uuid: str) -> None:
        assert self._timeslice is not None
        try:
            await asyncio.wait_for(
                self._timeslice.set_timeslice(gpu_uuid, 0), self.settings.timeslice_timeout_s
            )
        except (MpsError, TimeoutError) as exc:
            log.warning("dra-timeslice-reset-failed", gpu=gpu_uuid, error=_described(exc))

    def _remove_daemon_dir(self, key: str) -> None:
        """`<mps root>/<key>`: the stopped daemon's pipe, log and shm directories. Left in
        place (and said so) while its pid file says a daemon may still be running there."""
        try:
            base = Path(self.settings.mps_root) / check_path_component(key, "MPS daemon key")
        except BadName as exc:
            log.warning("dra-mps-dir-kept", error=str(exc))
            return
        pid_file = base / "pipe" / PID_FILE
        if _daemon_may_run(pid_file):
            log.warning("dra-mps-dir-kept", dir=str(base), reason="its daemon may still run")
            return
        # a stray's tmpfs (its agent gone before it stopped the daemon) goes with the directory
        why = unmount(str(base / "shm"))
        if why is not None:
            log.warning("dra-mps-shm-unmount-failed", dir=str(base / "shm"), error=why)
        shutil.rmtree(base, ignore_errors=True)

    # -- record ----------------------------------------------------------------------------

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


def _daemon_may_run(pid_file: Path) -> bool:
    """Whether the daemon a pid file names may still run. Not when there is none, nor when
    it was written before this boot (nothing survives a reboot, and the pid may since be
    another process's), nor when no process has that pid. What cannot be told (a file that
    cannot be read, or holds no pid) counts as running: its directory is kept. Asked only
    once the daemon was told to quit, so a clock stepped after the file was written costs
    at most the directory of a daemon that was stopping anyway."""
    try:
        written = pid_file.lstat().st_mtime
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if written < boot_time():
        return False
    try:  # the MPS adapter's own bounded reader: a pod can write this directory
        pid = int(read_pid_file(pid_file).strip())
    except (IdentityError, ValueError):
        return True
    return pid > 0 and process_alive(pid)


def _allocated(claim: ResourceClaim, driver: str, pool: str) -> list[str]:
    """The device names the claim's allocation gives this driver on this node's pool (what
    `claim_work` checks in full; here only to find the partitions to create first)."""
    if claim.allocation is None or claim.allocation.results is None:
        return []
    return [r.device for r in claim.allocation.results if (r.driver, r.pool) == (driver, pool)]


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _failed(ref: ClaimRef, error: str) -> PrepareResult:
    log.warning("dra-prepare-failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=error)
    return PrepareResult(error=error)
