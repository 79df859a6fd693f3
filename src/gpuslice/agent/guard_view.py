"""What the memory guard sees at each poll, read from the snapshot it shares with the exporter.

An idle node is the common case and the guard polls every second, so the read starts with
the cheapest question the backend answers (is any process on a GPU?) and only builds a
snapshot (telemetry, the kubelet's PodResources list, `/proc`, attribution) when one is.
While the answer is no, `idle_probe` asks it from a thread of its own and wakes the event
loop only when a process appears: one wake-up a second on an idle node instead of the
loop's timer, a worker thread, the result coming back and the watchdog's look.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import cast, get_args

from gpuslice.agent.dra_driver import DraDriver
from gpuslice.aio.waiting import unless_stopped
from gpuslice.core.caps import MemoryLimits
from gpuslice.core.guard import ContainerKey, GpuMemory
from gpuslice.core.guard.model import ClaimOverride, GuardMode, claim_mode
from gpuslice.core.protection import guard_tenants
from gpuslice.core.sharing.model import Plan
from gpuslice.core.units import MIB
from gpuslice.guard import GuardView
from gpuslice.guard.enforcement import ReadView
from gpuslice.logs import get_logger
from gpuslice.metrics import SnapshotRefresher
from gpuslice.metrics.procfs import cgroup_identities
from gpuslice.metrics.snapshot import CurrentPlan
from gpuslice.ports import GpuBackend

log = get_logger("gpuslice.guard")

IDLE_VIEW = GuardView(gpus=(), tenants=(), identities={})
"""No process on any GPU: nobody can be over a share, and evaluating this view clears the
guard's state (a container it was stopping has nothing left to stop)."""


def guard_view_reader(
    backend: GpuBackend,
    current: CurrentPlan,
    shared: SnapshotRefresher,
    proc_root: Path,
    *,
    mode_of: Callable[[str], GuardMode | None] | None = None,
    confirmed: Callable[[], Mapping[tuple[ContainerKey, str], MemoryLimits]] | None = None,
) -> ReadView:
    """The guard's `read`: None while the plan shares no GPU by time-slicing or MPS (MIG
    and exclusive GPUs are exempt), `IDLE_VIEW` while no GPU has a process, otherwise the
    GPUs' memory and the attributed tenants from a fresh shared snapshot.

    `mode_of` (DRA mode) gives a resource's own guard mode, e.g. claim `claim:<ns>/<name>`
    -> its GuardConfig `mode`, None when it has none; it can only lower the node's mode.
    `confirmed` gives the limits the caps loop confirmed (`agent.caps`), with each cgroup's
    memory: the guard steps back for a container the driver holds within its hard limit,
    whose overrun fails its own allocation, and keeps one above it (`core.protection`)."""
    told_unified: set[str] = set()

    async def read() -> GuardView | None:
        plan = current()
        if plan is None or not shares_memory(plan[0]):
            return None
        if not await _any_gpu_process(backend):
            return IDLE_VIEW
        snap = await shared.refresh()
        tenants = guard_tenants(
            snap.attribution,
            plan[0],
            mode_of=mode_of,
            confirmed=None if confirmed is None else confirmed(),
        )
        pids = [p for t in tenants for p in t.pids]
        identities = await asyncio.to_thread(cgroup_identities, pids, proc_root) if pids else {}
        gpus = []
        for g in snap.gpus:
            free = g.status.memory_free_mib
            if free is None or g.memory_total_mib <= 0:
                # A unified-memory GPU: no memory figure to hold a share against; leaving it
                # out of the view leaves its tenants unwatched (the guard is off there).
                if g.uuid not in told_unified:
                    told_unified.add(g.uuid)
                    log.warning(
                        "guard-off-unified-memory",
                        gpu=g.uuid,
                        reason="NVML reports no memory figure for this GPU (unified memory)",
                    )
                continue
            gpus.append(
                GpuMemory(
                    g.uuid, g.index, g.memory_total_mib * MIB, min(free, g.memory_total_mib) * MIB
                )
            )
        return GuardView(tuple(gpus), tenants, identities)

    return read


_GUARD_MODES = frozenset(get_args(GuardMode))


def claim_modes(
    driver: DraDriver, node: GuardMode, override: ClaimOverride
) -> Callable[[str], GuardMode | None]:
    """The guard's `mode_of` in DRA mode: a claim's GuardConfig `mode` as `core.guard.model.
    claim_mode` lets it apply, given whether the claim shares a GPU right now. A mode that
    is ignored is logged once per claim (by UID: a claim made again under the same name is
    told again), since the claim's author expects it to apply and the pods' fate differs."""
    told: set[str] = set()

    def mode_of(resource: str) -> GuardMode | None:
        claim = driver.claim_of(resource)
        if claim is None or claim.guard_mode not in _GUARD_MODES:
            return None
        asked = cast(GuardMode, claim.guard_mode)
        shared = resource in driver.sharing_claims()
        mode = claim_mode(node, asked, shared=shared, override=override)
        if mode is None and claim.uid not in told:
            told.intersection_update(c.uid for c in driver.claims.values())
            told.add(claim.uid)
            log.warning(
                "guard-claim-mode-ignored",
                claim=f"{claim.namespace}/{claim.name}",
                uid=claim.uid,
                asked=asked,
                applied=node,
                reason="the claim shares a GPU with other claims",
                allowed_by="--memory-guard-claim-override=allow",
            )
        return mode

    return mode_of


def shares_memory(plan: Plan) -> bool:
    """Some resource shares a GPU's memory between holders: a time-slicing or MPS resource,
    or (a DRA claims plan) a whole GPU meant for several pods or a consumable share."""
    return any(
        r.strategy.shares_memory
        or any(
            d.physical.kind == "gpu" and (d.replicas > 1 or d.entitlement_mib is not None)
            for d in r.devices
        )
        for r in plan.resources
    )


def idle_probe(backend: GpuBackend) -> Callable[[asyncio.Event, float], Awaitable[None]]:
    """The guard's `idle_wait`: returns once a GPU has a process (or the backend cannot
    say, which the next poll reports), or `stop` is set. The question is asked every
    `interval_s` on a thread that touches the loop only to say so."""

    async def wait(stop: asyncio.Event, interval_s: float) -> None:
        loop = asyncio.get_running_loop()
        seen = asyncio.Event()
        halt = threading.Event()

        def probe() -> None:
            while not halt.wait(interval_s):
                try:
                    busy = bool(backend.processes())
                except Exception:
                    busy = True
                if busy:
                    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                        loop.call_soon_threadsafe(seen.set)
                    return

        thread = threading.Thread(target=probe, name="guard-idle-probe", daemon=True)
        thread.start()
        try:
            await unless_stopped(stop, seen.wait())
        finally:
            halt.set()

    return wait


async def _any_gpu_process(backend: GpuBackend) -> bool:
    """A backend that cannot answer counts as busy: the full refresh then reports why."""
    try:
        return bool(await asyncio.to_thread(backend.processes))
    except Exception:
        return True
