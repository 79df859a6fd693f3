"""The memory guard's loop: poll, evaluate the pure policy, then log, post and act.

The policy (`gpuslice.core.guard`) decides; this module only carries decisions out. Every
decision is logged with the pod, GPU, usage, share, free memory and action, posted as a
Warning Event on the pod when an Event sink is wired, and counted. In `observe` mode
nothing is stopped. A reclaim the adapter could not carry out (no signallable process, a
refused eviction) is dropped from the carried state so the next poll tries again instead
of counting that memory as being freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gpuslice.core.cgroups import CgroupIdentity, PodUid
from gpuslice.core.guard import (
    ContainerKey,
    Decision,
    GpuMemory,
    GuardParams,
    GuardState,
    Tenant,
    evaluate,
)
from gpuslice.core.guard.model import GuardAction
from gpuslice.core.guard.policy import Evaluation
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB
from gpuslice.guard.signals import ProcessSignaller, Target
from gpuslice.logs import get_logger

log = get_logger("gpuslice.guard")


OVER_SHARE = "GPUMemoryOverShare"
RECLAIMED = "GPUMemoryReclaimed"


@dataclass(frozen=True, slots=True)
class GuardView:
    """One poll: the GPUs' memory, the tenants on them, and the cgroup of each tenant PID."""

    gpus: tuple[GpuMemory, ...]
    tenants: tuple[Tenant, ...]
    identities: Mapping[int, CgroupIdentity]


ReadView = Callable[[], Awaitable[GuardView | None]]
IdleWait = Callable[[asyncio.Event, float], Awaitable[None]]
"""Waits, off the event loop, until a GPU may have a process again (or the stop event):
called after a poll found no process on any GPU, with the poll interval."""
PostEvent = Callable[[str, str, PodUid | None, str, str], Awaitable[bool]]
"""(namespace, pod, pod UID, reason, message) -> posted; always a Warning Event."""
Evict = Callable[[str, str], Awaitable[bool]]
"""(namespace, pod) -> the Eviction API accepted it."""
TerminateMpsClients = Callable[[str, tuple[int, ...]], Awaitable[int]]
"""(GPU UUID, client PIDs) -> how many the MPS servers there were asked to terminate
(`mps.MpsDaemonManager.terminate_clients`), before an MPS tenant is signalled."""


class MemoryGuard:
    def __init__(
        self,
        *,
        read: ReadView,
        params: GuardParams,
        interval_s: float = 1.0,
        action: GuardAction = "kill",
        signaller: ProcessSignaller | None = None,
        evict: Evict | None = None,
        post_event: PostEvent | None = None,
        on_decision: Callable[[Decision], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        idle_wait: IdleWait | None = None,
        terminate_mps_clients: TerminateMpsClients | None = None,
    ) -> None:
        self.read = read
        self.terminate_mps_clients = terminate_mps_clients
        """NVIDIA's MPS documentation says a client killed without `terminate_client` may
        hang its server and the other clients: an MPS tenant is terminated there first."""
        self.idle_wait = idle_wait
        """While no GPU has a process nobody can be over a share: the guard then waits on
        this instead of polling through the loop, so an idle node's loop is not woken."""
        self._idle = False
        self.params = params
        self.interval_s = interval_s
        self.action = action
        self.signaller = signaller or ProcessSignaller()
        self.evict = evict
        self.post_event = post_event
        self.on_decision = on_decision
        self.clock = clock
        self.state = GuardState()
        self.latest: Evaluation | None = None

    async def run(self, stop: asyncio.Event) -> None:
        if self.params.mode == "off":
            return
        log.info(
            "guard-started",
            mode=self.params.mode,
            reserve=str(self.params.reserve),
            grace_s=self.params.grace_s,
            interval_s=self.interval_s,
            action=self.action,
            strict=self.params.strict,
        )
        while not stop.is_set():
            self._idle = False
            try:
                await self.poll()
            except Exception:
                log.exception("guard-poll-failed")
            if self._idle and self.idle_wait is not None:
                await self.idle_wait(stop, self.interval_s)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)

    async def poll(self) -> Evaluation | None:
        view = await self.read()
        if view is None:
            return None
        self._idle = not view.gpus and not view.tenants
        ev = evaluate(view.gpus, view.tenants, self.state, self.params, self.clock())
        failed: set[ContainerKey] = set()
        for d in ev.decisions:
            if not await self._carry_out(d, view):
                failed.add(d.key)
        state = ev.state
        if failed:
            stopping = {k: v for k, v in state.stopping.items() if k not in failed}
            state = dataclasses.replace(state, stopping=stopping)
        self.state = state
        self.latest = ev
        return ev

    async def _carry_out(self, d: Decision, view: GuardView) -> bool:
        """Log, count, post and (when enforced) act; False when an enforced act failed."""
        pids = tuple(sorted({p for t in view.tenants if t.key == d.key for p in t.pids}))
        pair = (d.key, d.gpu_uuid)
        target = _target(pids, view.identities)
        acted = True
        what = "report"
        if d.enforced and d.kind in ("reclaim", "escalate"):
            if self.action == "evict":
                what = "evict" if d.kind == "reclaim" else "wait-eviction"
                if d.kind == "reclaim":
                    acted = self.evict is not None and await self.evict(d.key.namespace, d.key.pod)
            else:
                sig = signal.SIGTERM if d.kind == "reclaim" else signal.SIGKILL
                what = sig.name
                if target is None:
                    acted = False
                else:
                    mps = any(
                        t.kind is SharingStrategy.MPS
                        for t in view.tenants
                        if (t.key, t.gpu_uuid) == pair
                    )
                    terminate = self.terminate_mps_clients
                    if (
                        mps
                        and d.kind == "reclaim"
                        and terminate is not None
                        and await terminate(d.gpu_uuid, pids)
                    ):
                        what = f"terminate_client+{what}"
                    report = await asyncio.to_thread(self.signaller.send, target, pids, sig)
                    acted = bool(report.signalled)
        elif d.kind == "reclaim":
            what = "would-reclaim"
        log.warning(
            f"guard-{d.kind}",
            namespace=d.key.namespace,
            pod=d.key.pod,
            container=d.key.container,
            gpu=d.gpu_index,
            uuid=d.gpu_uuid,
            used_mib=d.used_bytes // MIB,
            share_mib=d.share_bytes // MIB,
            free_mib=d.free_bytes // MIB,
            reserve_mib=d.reserve_bytes // MIB,
            reason=d.reason or "-",
            action=what,
            enforced=d.enforced,
            ok=acted,
            pids=",".join(map(str, pids)) or "-",
        )
        if self.on_decision is not None:
            self.on_decision(d)
        if self.post_event is not None:
            reason = OVER_SHARE if d.kind == "over-share" or not d.enforced else RECLAIMED
            uid = target.pod_uid if target is not None else None
            await self.post_event(d.key.namespace, d.key.pod, uid, reason, message(d, what))
        return acted


def _target(pids: tuple[int, ...], identities: Mapping[int, CgroupIdentity]) -> Target | None:
    """The one pod (and container, when all agree) the container's PIDs were seen in."""
    seen = [identities[p] for p in pids if p in identities]
    uids = {i.pod_uid for i in seen}
    if len(uids) != 1:
        return None
    containers = {i.container_id for i in seen}
    container = next(iter(containers)) if len(containers) == 1 else None
    return Target(next(iter(uids)), container)


def message(d: Decision, what: str) -> str:
    gpu = f"GPU {d.gpu_index} ({d.gpu_uuid})" if d.gpu_index is not None else d.gpu_uuid
    share = f"its share is {d.share_bytes // MIB} MiB"
    if d.holder is not None and d.holder_used_bytes is not None:
        # a claim's pods are held together to the claim's share
        share = (
            f"its claim {d.holder.removeprefix('claim:')}'s pods use "
            f"{d.holder_used_bytes // MIB} MiB of the claim's {d.share_bytes // MIB} MiB"
        )
    head = (
        f"container {d.key.container} uses {d.used_bytes // MIB} MiB of {gpu}, "
        f"{share}; {d.free_bytes // MIB} MiB free, reserve {d.reserve_bytes // MIB} MiB"
    )
    if d.borrowing_growth_bytes_per_s > 0 and d.free_bytes >= d.reserve_bytes:
        head += f", borrowing growing {d.borrowing_growth_bytes_per_s // MIB} MiB/s"
    if d.kind == "over-share":
        return f"{head}: borrowing while memory is free"
    if not d.enforced:
        return f"{head}: would be reclaimed ({d.reason}), memory guard in observe mode"
    if d.kind == "escalate":
        return f"{head}: still running after the grace period, {what}"
    return f"{head}: reclaimed ({d.reason}) with {what}"
