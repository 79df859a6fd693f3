"""The DRA driver's Prepare and Unprepare: the `ports.ClaimPreparer` behind `dra.sock`.

Prepare reads the claim (the kubelet sends only namespace, UID and name), lets the core
decide what it means on this node (`core.dra.claims`), refuses a device already prepared
for another claim (the driver is the last line of defence against a double allocation),
records `PrepareStarted`, applies the sharing (an MPS control daemon per MPS config group,
one per shared GPU for MPS shares, a time-slice interval when one is asked for), writes the
claim's CDI spec and records `PrepareCompleted` with what it returned. A repeated Prepare
returns the recorded answer without touching the node again; Unprepare undoes exactly what
the record says, and succeeds for a claim it never prepared.

The record survives restarts (`core.dra.prepared`): a file that does not decode is moved
aside and reported instead of crash-looping the agent, and a record from before a reboot
is dropped with every CDI spec it left, since nothing it describes exists any more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuslice.core.dra.cdispec import CdiDevice, cdi_id, claim_spec
from gpuslice.core.dra.claimplan import claim_resource, claims_plan
from gpuslice.core.dra.claims import ClaimError, ClaimWork, claim_work, daemon_spec
from gpuslice.core.dra.kubelet_api import ClaimRef, PreparedDevice, PrepareResult
from gpuslice.core.dra.preparation import SetInterval, StartDaemon, preparation
from gpuslice.core.dra.prepared import (
    AppliedSharing,
    Checkpoint,
    DeviceUse,
    PreparedClaim,
    decode,
    encode,
)
from gpuslice.core.dra.publish import dra_devices, share_offers
from gpuslice.core.mps import MpsDaemonSpec
from gpuslice.core.sharing.model import Plan
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.kubelet.state import Snapshot
from gpuslice.logs import get_logger
from gpuslice.mps import MpsDaemonManager, MpsError, TimesliceSetter
from gpuslice.ports import DraObjectNotFound, DraObjects

log = get_logger("gpuslice.dra.driver")

Warn = Callable[[str, str], Awaitable[None]]
"""Posts a Warning Event on the Node: (reason, message)."""


@dataclass(frozen=True, slots=True)
class DriverSettings:
    driver: str
    node: str
    """The node's name: the pool every device of this node is published in."""
    mps_root: str
    """Where claim MPS daemons keep their pipe, log and shm directories."""
    dev_root: str = "/dev"
    mps_ready_timeout_s: float = 10.0
    """How long Prepare waits for a new MPS daemon to answer before failing the claim."""
    api_timeout_s: float = 15.0
    """How long Prepare waits for the API to return a claim: an API server that hangs fails
    the claims concerned well within the kubelet's 45 s, and never holds the others."""


@dataclass(slots=True)
class _Applied:
    """What one Prepare changed so far, so a failure can undo it."""

    sharing: list[AppliedSharing]
    cdi: list[CdiDevice]
    uses: list[DeviceUse]


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
    ) -> None:
        self.settings = settings
        self._objects = objects
        self._checkpoint = checkpoint
        self._cdi = cdi
        self._snapshot = snapshot
        self._boot_id = boot_id
        self._mps = mps
        self._timeslice = timeslice
        self._warn = warn
        self._claims: dict[str, PreparedClaim] = {}
        self._daemons: dict[str, MpsDaemonSpec] = {}
        self._lock = asyncio.Lock()
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
        for claim in self._claims.values():
            if claim_resource(claim.namespace, claim.name) == resource:
                return claim.guard_mode
        return None

    # -- start -----------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the record; drop what a reboot or a half-done Prepare left behind."""
        raw = await asyncio.to_thread(self._checkpoint.read)
        decoded = decode(raw, self._boot_id)
        if decoded.status == "corrupt":
            moved = await asyncio.to_thread(self._checkpoint.quarantine)
            message = (
                f"DRA checkpoint {self._checkpoint.path} could not be read ({decoded.reason}); "
                f"moved to {moved} and starting with no prepared claims"
            )
            log.error("dra-checkpoint-corrupt", message=message)
            await self._post("CheckpointCorrupt", message)
        elif decoded.status == "stale":
            log.warning("dra-checkpoint-stale", reason=decoded.reason)
        claims = dict(decoded.checkpoint.claims)
        for uid, claim in list(claims.items()):
            if claim.state != "PrepareCompleted":
                log.warning("dra-prepare-unfinished", claim=f"{claim.namespace}/{claim.name}")
                del claims[uid]
        self._claims = claims
        # CDI specs of claims not (or no longer) prepared: a reboot, a crash mid-Prepare.
        for uid in await asyncio.to_thread(self._cdi.claims):
            if uid not in claims:
                await asyncio.to_thread(self._cdi.remove, uid)
                log.info("dra-cdi-orphan-removed", claim_uid=uid)
        for claim in claims.values():
            for applied in claim.applied:
                spec = self._spec_of(claim, applied)
                if spec is not None:
                    self._daemons[spec.resource] = spec
        if decoded.status != "ok" or raw is None:
            await self._write()
        if self._mps is not None:
            await self._quit_strays()
            if self._daemons:
                await self._mps.reconfigure(self._daemons.values())
        self.loaded = True
        log.info("dra-checkpoint-loaded", claims=len(claims), status=decoded.status)

    async def _quit_strays(self) -> None:
        """Daemons are left running across agent restarts; one whose claim the record no
        longer holds (a corrupt record, a Prepare cut short) would serve nobody forever."""
        assert self._mps is not None
        root = Path(self.settings.mps_root)
        try:
            keys = await asyncio.to_thread(
                lambda: sorted(p.name for p in root.iterdir() if (p / "pipe").is_dir())
            )
        except FileNotFoundError:
            return
        for key in keys:
            if key not in self._daemons:
                await self._mps.quit_stray(daemon_spec(key, self.settings.mps_root, []))

    def _spec_of(self, claim: PreparedClaim, applied: AppliedSharing) -> MpsDaemonSpec | None:
        if not applied.mps_key:
            return None
        indices = self._gpu_indices()
        gpus = [(u, indices[u]) for u in applied.gpu_uuids if u in indices]
        if not gpus:
            return None
        return daemon_spec(
            applied.mps_key,
            self.settings.mps_root,
            gpus,
            thread_percentage=applied.thread_percentage,
            limits_mib=dict(applied.limits_mib),
        )

    def _gpu_indices(self) -> dict[str, int]:
        snap = self._snapshot()
        return {} if snap is None else {g.uuid: g.index for g in snap.inventory.gpus}

    # -- ports.ClaimPreparer ---------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        # Claims are read before taking the lock, all at once: a slow API server delays
        # only the batch that waits on it, not Prepare and Unprepare of other pods.
        pending = [r for r in claims if not self._completed(r.uid)]
        fetched = await asyncio.gather(*(self._read_claim(r) for r in pending))
        objects = {r.uid: got for r, got in zip(pending, fetched, strict=True)}
        async with self._lock:
            return {ref.uid: await self._prepare_one(ref, objects.get(ref.uid)) for ref in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        async with self._lock:
            return {ref.uid: await self._unprepare_one(ref) for ref in claims}

    # -- prepare ---------------------------------------------------------------------------

    def _completed(self, uid: str) -> bool:
        done = self._claims.get(uid)
        return done is not None and done.state == "PrepareCompleted"

    async def _read_claim(self, ref: ClaimRef) -> Mapping[str, object] | str:
        """The claim from the API, or why it could not be read."""
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        try:
            return await asyncio.wait_for(
                self._objects.get_claim(ref.namespace, ref.name), self.settings.api_timeout_s
            )
        except DraObjectNotFound:
            return f"{where} not found in the API (deleted?)"
        except TimeoutError:
            return (
                f"reading {where}: no answer from the API within {self.settings.api_timeout_s:g} s"
            )
        except Exception as exc:
            return f"reading {where}: {exc}"

    async def _prepare_one(
        self, ref: ClaimRef, claim: Mapping[str, object] | str | None
    ) -> PrepareResult:
        done = self._claims.get(ref.uid)
        if done is not None and done.state == "PrepareCompleted":
            return PrepareResult(done.devices)  # the kubelet asks again after its restart
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        if claim is None:  # completed when the batch came in, unprepared meanwhile
            claim = await self._read_claim(ref)
        if isinstance(claim, str):
            return _failed(ref, claim)
        try:
            work = self._work(claim, ref)
            self._check_overlap(work)
        except ClaimError as exc:
            return _failed(ref, str(exc))
        started = PreparedClaim(ref.uid, ref.namespace, ref.name, "PrepareStarted")
        applied = _Applied([], [], [])
        try:
            self._claims[ref.uid] = started
            await self._write()
            await self._apply(work, applied)
            devices = self._prepared_devices(work)
            spec = claim_spec(ref.uid, applied.cdi, dev_root=self.settings.dev_root)
            await asyncio.to_thread(self._cdi.write, ref.uid, spec)
            guard = next((d.sharing.guard_mode for d in work.devices if d.sharing.guard_mode), None)
            self._claims[ref.uid] = replace(
                started,
                state="PrepareCompleted",
                devices=devices,
                applied=tuple(applied.sharing),
                uses=tuple(applied.uses),
                guard_mode=guard,
            )
            await self._write()
        except Exception as exc:  # whatever failed, the claim leaves nothing behind
            await self._undo(ref.uid, applied.sharing)
            self._claims.pop(ref.uid, None)
            await self._write_quietly()
            if not isinstance(exc, ClaimError | MpsError | OSError | ValueError):
                log.exception("dra-prepare-crashed", claim=f"{ref.namespace}/{ref.name}")
            if isinstance(exc, ClaimError | MpsError):
                return _failed(ref, str(exc))
            return _failed(ref, f"{where}: {type(exc).__name__}: {exc}")
        log.info(
            "dra-prepared",
            claim=f"{ref.namespace}/{ref.name}",
            uid=ref.uid,
            devices=",".join(d.device for d in devices),
        )
        return PrepareResult(devices)

    def _work(self, claim: Mapping[str, object], ref: ClaimRef) -> ClaimWork:
        snap = self._snapshot()
        if snap is None:
            raise ClaimError("the driver has not read this node's GPUs yet")
        devices = {d.name: d for d in dra_devices(snap.inventory)}
        by_uuid = share_offers(snap.plan)
        offers = {name: by_uuid[d.uuid] for name, d in devices.items() if d.uuid in by_uuid}
        return claim_work(
            claim,
            ref,
            driver=self.settings.driver,
            pool=self.settings.node,
            devices=devices,
            offers=offers,
        )

    def _check_overlap(self, work: ClaimWork) -> None:
        """Two claims never hold the same device, unless both hold shares of it or one
        holds it through adminAccess."""
        for dw in work.devices:
            for other in self._claims.values():
                if other.uid == work.ref.uid:
                    continue
                for use in other.uses:
                    if use.device != dw.device.name or dw.admin or use.admin:
                        continue  # adminAccess reaches devices others hold, by design
                    if dw.share_id is not None and use.share_id is not None:
                        continue
                    raise ClaimError(
                        f"ResourceClaim {work.ref.namespace}/{work.ref.name}: device "
                        f"{dw.device.name} is already prepared for ResourceClaim "
                        f"{other.namespace}/{other.name} (UID {other.uid})"
                    )

    def _prepared_devices(self, work: ClaimWork) -> tuple[PreparedDevice, ...]:
        return tuple(
            PreparedDevice(
                request_names=(dw.request_name,),
                pool=self.settings.node,
                device=dw.device.name,
                cdi_ids=(cdi_id(work.ref.uid, dw.device.name),),
                share_id=dw.share_id,
            )
            for dw in work.devices
        )

    async def _apply(self, work: ClaimWork, applied: _Applied) -> None:
        """Carry out the claim's steps in order, keeping each one's record once done."""
        prepared = preparation(work, self.settings.mps_root)
        for step in prepared.steps:
            if isinstance(step, StartDaemon):
                # recorded first: a daemon that never answers is still one to stop
                applied.sharing.append(step.record)
                await self._start_daemon(step.spec)
            else:
                await self._set_interval(step)  # recorded once set: nothing to reset else
                applied.sharing.append(step.record)
        applied.cdi.extend(prepared.cdi)
        applied.uses.extend(prepared.uses)

    async def _set_interval(self, step: SetInterval) -> None:
        if self._timeslice is None:
            raise ClaimError(
                f"{step.source}: this node cannot set time-slice intervals "
                "(no nvidia-smi configured); remove timeSlicingConfig.interval"
            )
        try:
            await self._timeslice.set_timeslice(step.gpu_uuid, step.interval)
        except MpsError as exc:
            raise ClaimError(
                f"{step.source}: GPU {step.gpu_uuid} does not take time-slice interval "
                f"{step.interval}: {exc}"
            ) from None

    async def _start_daemon(self, spec: MpsDaemonSpec) -> None:
        if self._mps is None:
            raise ClaimError("MPS is not available on this node (no MPS control program)")
        if self._daemons.get(spec.resource) != spec:
            self._daemons[spec.resource] = spec
            await self._mps.reconfigure(self._daemons.values())
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

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        claim = self._claims.get(ref.uid)
        if claim is None:
            return ""  # never prepared here, or already unprepared: both are success
        await self._undo(ref.uid, list(claim.applied))
        del self._claims[ref.uid]
        try:
            await self._write()
        except OSError as exc:
            self._claims[ref.uid] = claim
            return f"ResourceClaim {ref.namespace}/{ref.name}: writing the checkpoint: {exc}"
        log.info("dra-unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
        return ""

    async def _undo(self, claim_uid: str, applied: Sequence[AppliedSharing]) -> None:
        """Undo what the record says, best effort: a step that fails is logged, never
        blocks the rest (the claim is gone for the kubelet either way)."""
        others = [c for uid, c in self._claims.items() if uid != claim_uid]
        still_used = {a.mps_key for c in others for a in c.applied if a.mps_key}
        stopped = False
        for a in applied:
            if a.mps_key and a.mps_key not in still_used and a.mps_key in self._daemons:
                del self._daemons[a.mps_key]
                stopped = True
            if a.interval is not None and a.interval != 0 and self._timeslice is not None:
                for uuid in a.gpu_uuids:
                    try:
                        await self._timeslice.set_timeslice(uuid, 0)
                    except MpsError as exc:
                        log.warning("dra-timeslice-reset-failed", gpu=uuid, error=str(exc))
        if stopped and self._mps is not None:
            await self._mps.reconfigure(self._daemons.values())
        try:
            await asyncio.to_thread(self._cdi.remove, claim_uid)
        except (OSError, ValueError) as exc:
            log.warning("dra-cdi-remove-failed", claim_uid=claim_uid, error=str(exc))

    # -- record ----------------------------------------------------------------------------

    async def _write(self) -> None:
        data = encode(Checkpoint(self._boot_id, dict(self._claims)))
        await asyncio.to_thread(self._checkpoint.write, data)

    async def _write_quietly(self) -> None:
        try:
            await self._write()
        except OSError as exc:
            log.error("dra-checkpoint-write-failed", error=str(exc))

    async def _post(self, reason: str, message: str) -> None:
        if self._warn is None:
            return
        try:
            await self._warn(reason, message)
        except Exception as exc:  # an unreachable API must not stop the driver
            log.warning("dra-event-failed", reason=reason, error=str(exc))


def _failed(ref: ClaimRef, error: str) -> PrepareResult:
    log.warning("dra-prepare-failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=error)
    return PrepareResult(error=error)
