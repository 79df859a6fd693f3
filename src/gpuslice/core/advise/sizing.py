"""How many replicas a GPU model can be split into, and what each pod should ask for.

One rule under every strategy: a pod needs its observed peak plus the headroom. A
time-sliced replica gets the GPU's memory / replicas only by convention (nothing enforces
it; the memory guard defends it), so the count is the largest whose share holds the
largest need among the pods sized; MPS pins the same share as a hard limit, so the same
count is safe there only because the share holds every peak; a DRA consumable share asks
for exactly its pod's need. Leakers and idle pods are not sized (`stats.PodStats.sized`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.core.advise.stats import PodStats
from gpuslice.core.describe import gib

MAX_REPLICAS = 48
"""MPS serves at most 48 clients per GPU (Volta and later); time-slicing is held to the
same count, where each pod's turn on the GPU is already under 2 % of the time."""


def need_mib(peak_mib: int, headroom_percent: float) -> int:
    return math.ceil(peak_mib * (1 + headroom_percent / 100))


@dataclass(frozen=True, slots=True)
class TimeSlicing:
    replicas: int
    share_mib: int
    """memory / replicas: what a replica is entitled to (the guard's share)."""
    need_mib: int
    sized_by: str
    """The pod with the largest need."""
    why: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MpsPlan:
    replicas: int
    pinned_limit_mib: int
    active_thread_percentage: int
    why: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DraRequest:
    pod: str
    container: str
    memory_mib: int
    why: str

    @property
    def quantity(self) -> str:
        """As a ResourceClaim's `capacity.requests.memory` (the driver's step is 1Mi)."""
        return f"{self.memory_mib}Mi"


def time_slicing(
    sized: Sequence[PodStats], memory_mib: int, headroom_percent: float
) -> TimeSlicing:
    """The largest replica count whose share holds every sized pod's peak + headroom.
    `sized` must not be empty."""
    top = max(sized, key=lambda s: (s.peak_mib, s.name))
    need = need_mib(top.peak_mib, headroom_percent)
    fits = memory_mib // need if need > 0 else MAX_REPLICAS
    replicas = max(1, min(MAX_REPLICAS, fits))
    share = memory_mib // replicas
    why = [
        f"largest peak: {top.name} at {gib(top.peak_mib)} GiB ({top.peak_mib} MiB) "
        f"of {len(sized)} pods sized; + {headroom_percent:g}% headroom = {gib(need)} GiB "
        f"({need} MiB)",
    ]
    if fits < 1:
        why.append(
            f"not even the whole GPU ({memory_mib} MiB) holds it with the headroom: "
            "replicas 1 (no sharing)"
        )
    elif fits > MAX_REPLICAS:
        why.append(
            f"{memory_mib} MiB / {fits} would still hold it; held to {MAX_REPLICAS} "
            "(MPS's client limit; each time slice already under 2 % of the time)"
        )
    else:
        why.append(
            f"{memory_mib} MiB / {replicas} = {share} MiB holds {need} MiB; "
            f"/ {replicas + 1} = {memory_mib // (replicas + 1)} MiB does not"
        )
    return TimeSlicing(replicas, share, need, top.name, tuple(why))


def mps(ts: TimeSlicing, memory_mib: int) -> MpsPlan:
    """The same replicas under MPS, with the limit gpuslice's plan pins for them."""
    limit = memory_mib // ts.replicas
    pct = 100 // ts.replicas
    why = (
        f"{ts.replicas} replicas as for time-slicing: pinned memory limit {memory_mib} MiB / "
        f"{ts.replicas} = {limit} MiB, enforced (a pod above it fails its own allocation, "
        f"not a neighbour's), {ts.need_mib} MiB needed by {ts.sized_by}",
        f"active thread percentage 100 / {ts.replicas} = {pct}%",
    )
    return MpsPlan(ts.replicas, limit, pct, why)


@dataclass(frozen=True, slots=True)
class CapsPlan:
    """The driver's memory caps for the recommended replicas (`core.caps`, r615+)."""

    soft_mib: int
    hard_mib: int
    policy: str
    """`strict` or `borrow`: `--memory-caps-policy`."""
    why: tuple[str, ...]


def caps_plan(ts: TimeSlicing, memory_mib: int, leakers: Sequence[str]) -> CapsPlan:
    """Soft = the share (the entitlement the agent gives each replica); hard = the share
    too (`strict`): the replicas were counted so that the share holds every sized pod's
    peak plus the headroom, so no pod sized needs to borrow, and a leaker's growth then
    fails its own allocation instead of a neighbour's."""
    why = [
        f"soft limit = the share, {memory_mib} MiB / {ts.replicas} = {ts.share_mib} MiB: "
        "what each replica is entitled to, guaranteed by the driver",
        f"hard limit = the share too (strict): it holds the largest need, {ts.need_mib} MiB "
        f"({ts.sized_by}), so no sized pod had to borrow",
    ]
    if leakers:
        why.append(
            f"leakers ({', '.join(leakers)}) would fail their own allocation at "
            f"{ts.share_mib} MiB instead of a neighbour's"
        )
    return CapsPlan(ts.share_mib, ts.share_mib, "strict", tuple(why))


def dra_requests(sized: Sequence[PodStats], headroom_percent: float) -> tuple[DraRequest, ...]:
    """Per sized pod: the memory its claim should consume from a shared GPU."""
    out = []
    for s in sorted(sized, key=lambda s: (s.name, s.trace.key.container)):
        need = need_mib(s.peak_mib, headroom_percent)
        out.append(
            DraRequest(
                s.name,
                s.trace.key.container,
                need,
                f"peak {s.peak_mib} MiB + {headroom_percent:g}% = {need} MiB (p99 {s.p99_mib} MiB)",
            )
        )
    return tuple(out)
