"""The DRA driver's Prepare of one claim: read it, make its dynamic MIG partitions, let
the core decide (`core.dra.claims`) on the snapshot's offer, reserve its devices against
the overlap guard, apply its sharing, write its CDI spec and record it; undone to its end
on any failure or cancellation.

`Preparer` owns reading claims from the API, the overlap guard, making a claim's MIG
devices, writing its CDI spec (with the caps `agent.caps` sets) and what Prepare records.
It applies the sharing through `agent.dra_sharing.ClaimSharing` and undoes through
`agent.dra_unprepare.Unpreparer`; the claims, their record and the locks are the driver's
state (`agent.dra_state`). The record keeper asks it what a claim's Prepare recorded, to
rebuild a lost record the same way (`rederive`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from gpuslice.agent.cdi_base import BaseSpec
from gpuslice.agent.dra_sharing import ClaimSharing
from gpuslice.agent.dra_state import DriverEvents, DriverState, InFlight, _described, _failed
from gpuslice.agent.dra_unprepare import Unpreparer
from gpuslice.agent.dynamic_mig import DynamicMig
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.caps import ContainerCaps
from gpuslice.core.cdi.hook import CdiCaps
from gpuslice.core.cdi.spec import CdiDevice, with_limits
from gpuslice.core.devices import Inventory, MigDevice
from gpuslice.core.dra.caps import claim_limits
from gpuslice.core.dra.cdispec import cdi_id, claim_spec
from gpuslice.core.dra.claimplan import claims_plan
from gpuslice.core.dra.claims import ClaimError, ClaimWork, claim_work
from gpuslice.core.dra.kubelet_api import ClaimRef, PreparedDevice, PrepareResult
from gpuslice.core.dra.names import BadName, check_claim_ref
from gpuslice.core.dra.partitions import not_offered
from gpuslice.core.dra.preparation import Preparation, preparation
from gpuslice.core.dra.prepared import AppliedSharing, DeviceUse, PreparedClaim
from gpuslice.core.dra.resource_claim import ResourceClaim
from gpuslice.core.protection import unreserved_memory
from gpuslice.core.sharing.model import PhysicalDevice
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.logs import get_logger
from gpuslice.mps import MpsError
from gpuslice.ports import DraObjectNotFound, DraObjects


def claim_cdi(
    caps: ContainerCaps,
    devices: Sequence[CdiDevice],
    uses: Sequence[DeviceUse],
    inventory: Inventory,
    unreserved: Mapping[str, int] | None = None,
) -> tuple[tuple[CdiDevice, ...], CdiCaps | None]:
    """A claim's CDI devices with the memory caps its holders get, and the hook to call.
    `unreserved`: GPU UUID -> memory no prepared share reserved (the hard limit of a share
    that reserved none, `core.protection.unreserved_memory`)."""
    physicals: dict[str, PhysicalDevice] = {
        g.uuid: PhysicalDevice.of_gpu(g) for g in inventory.gpus
    }
    limits = claim_limits(uses, physicals, caps.gpus(), caps.policy, unreserved)
    return with_limits(devices, limits), caps.hook_now()


log = get_logger("gpuslice.dra.driver")


class Preparer:
    """Prepares one claim at a time (the driver runs many at once)."""

    def __init__(
        self,
        state: DriverState,
        sharing: ClaimSharing,
        unpreparer: Unpreparer,
        *,
        objects: DraObjects,
        cdi: CdiSpecStore,
        events: DriverEvents,
        base: BaseSpec | None,
        dynamic_mig: DynamicMig | None,
        dynamic: Callable[[], Collection[str]],
    ) -> None:
        self._state = state
        self._sharing = sharing
        self._unpreparer = unpreparer
        self._objects = objects
        self._cdi = cdi
        self._events = events
        self._base = base
        self._dynamic_mig = dynamic_mig
        self._dynamic = dynamic
        self.caps: ContainerCaps | None = None
        """Memory caps for the claims' CDI specs (`agent.caps`), set by the builder where
        the node can take them; None: no caps in the specs."""

    async def prepare_claim(self, ref: ClaimRef) -> PrepareResult:
        """One claim, within its time budget; whatever goes wrong is this claim's error."""
        try:
            check_claim_ref(ref)  # before anything is read or created for it
        except BadName as exc:
            return _failed(ref, f"refused: {exc}")
        budget = self._state.settings.prepare_timeout_s
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
        done = self._state.completed(ref.uid)
        if done is not None:
            return PrepareResult(done.devices)  # the kubelet asks again after its restart
        # Read outside the claim's lock: a slow API server delays only this claim.
        claim = await self._read_claim(ref)
        async with self._state.claim_locks.holding([ref.uid]):
            done = self._state.completed(ref.uid)
            if done is not None:  # a Prepare of the same claim finished while this one read
                return PrepareResult(done.devices)
            if isinstance(claim, str):
                return _failed(ref, claim)
            try:
                made = await self._materialize(claim, ref)
                work = self._work(claim, ref, made)
                prepared = preparation(work, self._state.settings.mps_root)
                self._reserve(work, prepared.uses)
            except ClaimError as exc:
                await self._unpreparer.release(ref)
                return _failed(ref, str(exc))
            try:
                for notice in work.notices:  # the claim is prepared, on the node's terms
                    await self._events.post_about(ref, "ClaimConfigNotApplied", notice)
                return await self._carry_out(work, prepared)
            finally:
                del self._state.in_flight[ref.uid]

    async def _carry_out(self, work: ClaimWork, prepared: Preparation) -> PrepareResult:
        """Record `PrepareStarted`, apply, write the CDI spec, record `PrepareCompleted`; on
        any failure or cancellation, undo what was applied and drop the record entirely."""
        ref = work.ref
        applied = self._state.in_flight[ref.uid].sharing
        # the planned steps go into the record first: a crash mid-way leaves a record that
        # says what may have taken effect, and the next start undoes it (`load`)
        planned = tuple(step.record for step in prepared.steps)
        started = PreparedClaim(ref.uid, ref.namespace, ref.name, "PrepareStarted", applied=planned)
        try:
            self._state.claims[ref.uid] = started
            await self._state.write()
            await self._sharing.apply(prepared, applied)
            snap = self._state.snapshot()
            base = None if self._base is None else await self._base.cdi_id(snap)
            devices = self._prepared_devices(work, base)
            dev_root = "/" if snap is None else snap.host_dev_root
            cdi, hook = prepared.cdi, None
            if self.caps is not None and snap is not None:
                others = claims_plan(
                    self._state.claims.values(), snap.inventory, self._state.settings.node
                )
                free = unreserved_memory(others)
                cdi, hook = claim_cdi(self.caps, prepared.cdi, prepared.uses, snap.inventory, free)
            spec = claim_spec(
                ref.uid, cdi, host_dev_root=dev_root, caps=hook, driver_from_base=base is not None
            )
            await to_the_end(asyncio.to_thread(self._cdi.write, ref.uid, spec))
            self._state.claims[ref.uid] = replace(
                started,
                state="PrepareCompleted",
                devices=devices,
                applied=tuple(applied),
                uses=prepared.uses,
                guard_mode=work.guard_mode,
            )
            await self._state.write()
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
        await self._unpreparer.undo(ref.uid, applied)
        self._state.claims.pop(ref.uid, None)
        await self._state.write_quietly()
        await self._unpreparer.release(ref)
        log.info("dra-prepare-undone", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)

    async def _read_claim(self, ref: ClaimRef) -> ResourceClaim | str:
        """The claim from the API, read into what Prepare uses, or why it could not be read."""
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        timeout = self._state.settings.api_timeout_s
        try:
            return ResourceClaim.read(
                await asyncio.wait_for(self._objects.get_claim(ref.namespace, ref.name), timeout)
            )
        except DraObjectNotFound:
            return f"{where} not found in the API (deleted?)"
        except TimeoutError:
            return f"reading {where}: no answer from the API within {timeout:g} s"
        except Exception as exc:
            return f"reading {where}: {exc}"

    async def _materialize(self, claim: ResourceClaim, ref: ClaimRef) -> dict[str, MigDevice]:
        """Create the MIG devices of the claim's dynamic MIG partitions that do not exist
        yet (`agent.dynamic_mig`): device name -> the MIG device. ClaimError when one
        cannot be made."""
        snap = self._state.snapshot()
        if self._dynamic_mig is None or snap is None:
            return {}
        inventory = snap.inventory
        ours = self._dynamic_mig.ours()
        parts = self._state.offer(snap).partitions()
        allocated = _allocated(claim, self._state.settings.driver, self._state.settings.node)
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
        except Exception as exc:  # a record that cannot be written: the caller releases too
            raise ClaimError(
                f"ResourceClaim {ref.namespace}/{ref.name}: creating its MIG devices: "
                f"{_described(exc)}"
            ) from None
        except BaseException:  # a cancellation, which passes the caller by: released here
            await self._unpreparer.release(ref)
            raise
        return made

    def _work(
        self,
        claim: ResourceClaim,
        ref: ClaimRef,
        made: Mapping[str, MigDevice] | None = None,
    ) -> ClaimWork:
        """`made`: MIG devices just created for the claim, which the inventory read before
        their creation does not list yet."""
        snap = self._state.snapshot()
        if snap is None:
            raise ClaimError("the driver has not read this node's GPUs yet")
        offer = self._state.offer(snap)
        devices = offer.by_name()
        for name, mig in (made or {}).items():
            if name in devices:
                devices[name] = replace(devices[name], uuid=mig.uuid, mig=mig)
        offers = offer.offers_by_name()
        return claim_work(
            claim,
            ref,
            driver=self._state.settings.driver,
            pool=self._state.settings.node,
            devices=devices,
            offers=offers,
        )

    def _reserve(self, work: ClaimWork, uses: tuple[DeviceUse, ...]) -> None:
        """Check the overlap guard and reserve the claim's devices in one step (no await in
        between), so two concurrent Prepares cannot both take one device."""
        self._check_overlap(work)
        self._state.in_flight[work.ref.uid] = InFlight(work.ref, uses, [])

    def _check_overlap(self, work: ClaimWork) -> None:
        """Two claims never hold the same device, unless both hold shares of it or one
        holds it through adminAccess."""
        holders = self._state.holders()
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
                pool=self._state.settings.node,
                device=dw.device.name,
                cdi_ids=(*first, cdi_id(work.ref.uid, dw.device.name)),
                share_id=dw.share_id,
            )
            for dw in work.devices
        )

    def rederive(self, claim: ResourceClaim, ref: ClaimRef) -> PreparedClaim:
        """What the claim's Prepare recorded, derived again (the core decides it the same
        way every time) without touching the node: a lost record's rebuild
        (`agent.dra_record`). ClaimError where this node would not prepare it."""
        work = self._work(claim, ref)
        prepared = preparation(work, self._state.settings.mps_root)
        return PreparedClaim(
            ref.uid,
            ref.namespace,
            ref.name,
            "PrepareCompleted",
            devices=self._prepared_devices(work, None if self._base is None else self._base.last),
            applied=tuple(step.record for step in prepared.steps),
            uses=prepared.uses,
            guard_mode=work.guard_mode,
        )


def _allocated(claim: ResourceClaim, driver: str, pool: str) -> list[str]:
    """The device names the claim's allocation gives this driver on this node's pool (what
    `claim_work` checks in full; here only to find the partitions to create first)."""
    if claim.allocation is None or claim.allocation.results is None:
        return []
    return [r.device for r in claim.allocation.results if (r.driver, r.pool) == (driver, pool)]
