""" "Guaranteed share, borrow while free": which time-sliced containers to stop, and when.

Before driver branch r615 nothing in the driver or the kernel caps CUDA memory per
container under time-slicing, so the last process to allocate is the one that gets the
out-of-memory error, however small it is; where the driver caps a container (`core.caps`)
the agent leaves it out of the guard's view. The policy turns that around:

* a container may use more than its share (GPU memory / replicas x replicas held) while the
  GPU keeps at least the reserve free;
* when free memory stays below the reserve for the grace period (or falls below the
  critical part of it, when waiting would only let a neighbour fail), containers over their
  share are reclaimed, largest overrun first, until the memory they hold (counted as freed)
  brings free memory back to the reserve;
* "below the reserve" includes "falling fast enough to be below it within the grace plus
  the lookahead" (the rate since the previous poll): a poll sees a leak up to one interval
  late and a reclaim waits out the grace, so without this a leak slower than reserve / poll
  interval could still cost a neighbour its memory;
* a container within its share on a GPU is never chosen because of that GPU;
* `strict` stops any container over its share once the overrun has lasted the grace; so is
  one that holds more than its confirmed hard limit (`Tenant.hard_bytes`: memory allocated
  before its cap was set), whose excess may be what the driver holds back for the others'
  soft limits, which free memory does not show;
* a reclaimed container still holding memory after another grace is escalated (SIGKILL);
  while it is being stopped its memory counts as freed, so a slow exit does not pull in
  more victims.

A DRA share claim several containers use is one holder (`Tenant.holder`): its consumers'
memory together is held to the claim's share, and when the claim is over it, its largest
consumer is the victim (then the next, while the claim is still over).

MPS tenants are reclaimed like time-sliced ones: the MPS server holds each client process
to the daemon's pinned limit, but a client can unset its own lower limit (a DRA share
daemon's default is the largest share on its GPU) and a container can run several clients,
so an MPS share over its share is one the server did not hold. MIG and exclusive tenants
are skipped (nobody shares their memory). A container on several
GPUs is one victim: stopping it frees its memory on each of them.

A tenant may carry its own mode (a DRA claim's GuardConfig), which can only lower the
node's (`model.effective_mode`): an `off` tenant is not watched at all (its memory still
counts as used on the GPU); an `observe` tenant is reported, as the node's observe mode
would report it, but never stopped. Under a node that enforces, an observing tenant's
memory does not count as being freed, so it shields no enforced borrower on that GPU:
the guard goes on choosing them until the projection is back at the reserve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuslice.core.attribution import Attribution
from gpuslice.core.guard.model import (
    ContainerKey,
    Decision,
    DecisionKind,
    GpuMemory,
    GuardMode,
    GuardParams,
    GuardState,
    ReclaimReason,
    Tenant,
    effective_mode,
    holder_mode,
)


@dataclass(frozen=True, slots=True)
class Evaluation:
    decisions: tuple[Decision, ...]
    over_share: frozenset[tuple[ContainerKey, str]]
    """(container, GPU) pairs over their share now, MPS included (the exporter's gauge)."""
    state: GuardState


def tenants_from(
    attribution: Attribution, mode_of: Callable[[str], GuardMode | None] | None = None
) -> tuple[Tenant, ...]:
    """The guard's view of the exporter's attribution (one tenant per container per GPU).

    `mode_of` gives a resource's own guard mode (in DRA mode: claim `claim:<ns>/<name>` ->
    its GuardConfig `mode`), None where it has none; a tenant's mode follows `holder_mode`.
    """
    return tuple(
        Tenant(
            key=ContainerKey(u.namespace, u.pod, u.container),
            gpu_uuid=u.gpu_uuid,
            kind=u.entitlement.kind,
            share_bytes=u.entitlement.memory_bytes,
            used_bytes=u.memory_used_bytes,
            pids=u.pids,
            mode=None if mode_of is None else holder_mode(mode_of(r) for r in u.resources),
        )
        for u in attribution.usages
    )


def evaluate(
    gpus: Iterable[GpuMemory],
    tenants: Iterable[Tenant],
    state: GuardState,
    params: GuardParams,
    now: float,
) -> Evaluation:
    """One poll's decisions and the state for the next poll (rules in the module docstring)."""
    gpu_list = sorted(gpus, key=lambda g: g.uuid)
    by_gpu = {g.uuid: g for g in gpu_list}
    if params.mode == "off":
        return Evaluation((), frozenset(), GuardState())

    def mode(t: Tenant) -> GuardMode:
        return effective_mode(params.mode, t.mode)

    watched = [
        t for t in tenants if t.kind.shares_memory and t.gpu_uuid in by_gpu and mode(t) != "off"
    ]
    holdings: dict[tuple[str, str], list[Tenant]] = {}
    for t in watched:
        holdings.setdefault(_holding(t), []).append(t)
    holding_used = {h: sum(t.used_bytes for t in ts) for h, ts in holdings.items()}

    def overrun(t: Tenant) -> int:
        """Its holder's overrun: a container alone, or all consumers of one claim."""
        return holding_used[_holding(t)] - t.share_bytes

    growth = _borrowing_growth(watched, state, now, overrun)
    enforce = params.mode == "enforce"
    decisions: list[Decision] = []

    def decide(kind: DecisionKind, t: Tenant, reason: ReclaimReason | None, enforced: bool) -> None:
        g = by_gpu[t.gpu_uuid]
        shared = t.holder is not None
        decisions.append(
            Decision(
                kind=kind,
                key=t.key,
                gpu_uuid=g.uuid,
                gpu_index=g.index,
                used_bytes=t.used_bytes,
                share_bytes=t.share_bytes,
                free_bytes=g.free_bytes,
                reserve_bytes=params.reserve.of(g.total_bytes),
                enforced=enforced,
                reason=reason,
                pids=t.pids,
                borrowing_growth_bytes_per_s=int(growth.get(g.uuid, 0.0)),
                holder=t.holder,
                holder_used_bytes=holding_used[_holding(t)] if shared else None,
            )
        )

    # Containers being stopped: gone once they hold no memory anywhere.
    holding: dict[ContainerKey, list[Tenant]] = {}
    for t in watched:
        holding.setdefault(t.key, []).append(t)
    alive = {k for k, ts in holding.items() if any(t.used_bytes > 0 or t.pids for t in ts)}
    stopping = {k: at for k, at in state.stopping.items() if k in alive} if enforce else {}
    escalated = {k for k in state.escalated if k in stopping}
    for key, at in sorted(stopping.items()):
        if key not in escalated and now - at >= params.grace_s:
            escalated.add(key)
            for t in holding[key]:
                if t.used_bytes > 0 or t.pids:
                    decide("escalate", t, None, True)
                    break

    # Over-share bookkeeping and one notice per crossing.
    over_now = {(t.key, t.gpu_uuid) for t in watched if overrun(t) > 0}
    over_since: dict[tuple[ContainerKey, str], float] = {}
    for t in sorted(watched, key=lambda t: (t.key, t.gpu_uuid)):
        pair = (t.key, t.gpu_uuid)
        if pair not in over_now:
            continue
        if pair in state.over_since:
            over_since[pair] = state.over_since[pair]
        else:
            over_since[pair] = now
            decide("over-share", t, None, False)

    # Memory pressure per GPU, with hysteresis; memory of containers being stopped counts
    # as free already.
    freeing: dict[str, int] = {}

    def count_freed(key: ContainerKey) -> None:
        for t in holding.get(key, ()):
            freeing[t.gpu_uuid] = freeing.get(t.gpu_uuid, 0) + t.used_bytes

    for key in stopping:
        count_freed(key)
    pressure_since: dict[str, float] = {}
    # The projection covers the grace too: a reclaim waits out the grace, and the memory
    # must still be there for the neighbours when it happens.
    horizon = params.grace_s + params.lookahead_s if params.lookahead_s > 0 else 0.0
    ahead: dict[str, float] = {}  # free memory one horizon from now, before freeing
    for g in gpu_list:
        reserve = params.reserve.of(g.total_bytes)
        free = g.free_bytes + freeing.get(g.uuid, 0)
        ahead[g.uuid] = g.free_bytes - growth.get(g.uuid, 0.0) * horizon
        projected = ahead[g.uuid] + freeing.get(g.uuid, 0)
        release = reserve + int(reserve * params.hysteresis)
        if projected < reserve or (g.uuid in state.pressure_since and free < release):
            pressure_since[g.uuid] = state.pressure_since.get(g.uuid, now)

    reclaimable = [t for t in watched if t.key not in stopping]
    chosen: set[ContainerKey] = set()
    observed: set[ContainerKey] = set()
    relieved: dict[tuple[str, str], int] = {}
    """Holding -> memory its consumers being stopped give back: a claim brought back within
    its share by stopping its largest consumer loses no other."""
    for t in watched:
        if t.key in stopping:
            relieved[_holding(t)] = relieved.get(_holding(t), 0) + t.used_bytes

    def still_over(t: Tenant) -> bool:
        return overrun(t) - relieved.get(_holding(t), 0) > 0

    holding_hard: dict[tuple[str, str], int] = {}
    for h, ts in holdings.items():
        hards = [t.hard_bytes for t in ts]
        if all(x is not None for x in hards):
            holding_hard[h] = sum(x for x in hards if x is not None)

    def over_cap(t: Tenant) -> bool:
        h = _holding(t)
        hard = holding_hard.get(h)
        return hard is not None and holding_used[h] - relieved.get(h, 0) > hard

    def reclaim(t: Tenant, reason: ReclaimReason) -> None:
        acts = mode(t) == "enforce"
        chosen.add(t.key)
        if acts or not enforce:
            relieved[_holding(t)] = relieved.get(_holding(t), 0) + t.used_bytes
        if acts or t.key not in state.reported:
            decide("reclaim", t, reason, acts)
        if acts:
            stopping[t.key] = now
        else:
            observed.add(t.key)
        if acts or not enforce:
            # The node's observe mode reports the victims enforce would choose; a tenant
            # observing under a node that enforces frees nothing, so others still go.
            count_freed(t.key)

    # The largest overrun first (a holder's overrun does not change within the poll).
    by_overrun = sorted(reclaimable, key=lambda t: (-overrun(t), -t.used_bytes, t.key, t.gpu_uuid))
    for t in by_overrun:
        pair = (t.key, t.gpu_uuid)
        if t.key in chosen or pair not in over_since or not over_cap(t):
            continue
        if now - over_since[pair] >= params.grace_s:
            reclaim(t, "over-cap")

    if params.strict:
        for t in by_overrun:
            pair = (t.key, t.gpu_uuid)
            if t.key in chosen or pair not in over_since or not still_over(t):
                continue
            if now - over_since[pair] >= params.grace_s:
                reclaim(t, "strict")

    for g in gpu_list:
        since = pressure_since.get(g.uuid)
        reserve = params.reserve.of(g.total_bytes)
        critical = g.free_bytes + freeing.get(g.uuid, 0) < reserve * params.critical
        if since is None or (now - since < params.grace_s and not critical):
            continue
        for t in by_overrun:
            if t.gpu_uuid != g.uuid or overrun(t) <= 0:
                continue
            if ahead[g.uuid] + freeing.get(g.uuid, 0) >= reserve:
                break
            if t.key in chosen or not still_over(t):
                continue
            reclaim(t, "memory-pressure")

    return Evaluation(
        decisions=tuple(decisions),
        over_share=frozenset(over_now),
        state=GuardState(
            pressure_since=pressure_since,
            over_since=over_since,
            stopping=stopping,
            escalated=frozenset(escalated),
            reported=frozenset(observed),
            last_used={(t.key, t.gpu_uuid): (now, t.used_bytes) for t in watched},
        ),
    )


def _holding(t: Tenant) -> tuple[str, str]:
    """What a tenant's memory is held against: its claim's share, or its own."""
    return (t.holder if t.holder is not None else f"container {t.key}", t.gpu_uuid)


def _borrowing_growth(
    watched: Iterable[Tenant], state: GuardState, now: float, overrun: Callable[[Tenant], int]
) -> dict[str, float]:
    """GPU UUID -> bytes per second by which the watched containers over their share
    (their holder's, `overrun`) on it grew since the previous poll (shrinking ones count as
    0, new ones as not grown)."""
    out: dict[str, float] = {}
    for t in watched:
        before = state.last_used.get((t.key, t.gpu_uuid))
        if overrun(t) <= 0 or before is None:
            continue
        at, used_then = before
        if now > at and t.used_bytes > used_then:
            rate = (t.used_bytes - used_then) / (now - at)
            out[t.gpu_uuid] = out.get(t.gpu_uuid, 0.0) + rate
    return out
