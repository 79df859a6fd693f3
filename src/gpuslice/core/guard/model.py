"""Plain data the guard policy reads and writes: GPUs, tenants, parameters, carried state.

Everything here is frozen so an evaluation is a pure function of (view, state, params, now):
the adapter keeps the returned state and hands it back on the next poll, tests replay
sequences without a clock, and the benchmark drives the same code in simulated time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuslice.core.errors import GpusliceError
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import BINARY_SUFFIXES

GuardMode = Literal["off", "observe", "enforce"]
"""`off`: not evaluated; `observe`: decisions are logged and posted, nothing is stopped;
`enforce`: reclaim decisions stop the container."""

_ACTING: dict[GuardMode, int] = {"off": 0, "observe": 1, "enforce": 2}


def effective_mode(node: GuardMode, holder: GuardMode | None) -> GuardMode:
    """The mode that applies to one tenant: its holder's (a DRA claim's GuardConfig `mode`)
    where it acts less than the node's, else the node's. The node-wide mode is a ceiling a
    claim can only lower: `enforce` asked by a claim on an `observe` node stays `observe`,
    so whoever runs the node decides whether the guard may stop anything at all."""
    if holder is None or _ACTING[holder] >= _ACTING[node]:
        return node
    return holder


ClaimOverride = Literal["stricter-only", "allow"]
"""Whether a DRA claim may weaken the guard on a GPU it shares with other claims
(`--memory-guard-claim-override`): `stricter-only` (default) no, `allow` yes."""


def claim_mode(
    node: GuardMode, asked: GuardMode | None, *, shared: bool, override: ClaimOverride
) -> GuardMode | None:
    """The mode a claim's GuardConfig `mode` gets, None for the node's.

    The claim's author is a tenant, not the node's admin: a claim on a GPU shared with other
    claims that turns the guard `off` (or down to `observe`) for itself leaves its overrun on
    the GPU, and the enforcing guard then stops a neighbour instead. So there, unless the
    admin allows it, a mode below the node's is ignored. A claim alone on a whole GPU hurts
    nobody but its own pods by weakening it, and keeps its mode. A mode at or above the
    node's is passed on as asked; `effective_mode` keeps the node's as the ceiling."""
    if asked is None:
        return None
    if shared and override == "stricter-only" and _ACTING[asked] < _ACTING[node]:
        return None
    return asked


def holder_mode(modes: Iterable[GuardMode | None]) -> GuardMode | None:
    """One tenant's own mode from those of the resources it holds on that GPU: None (the
    node's) when any resource has no mode of its own, else the one that acts most. Memory
    used on one GPU cannot be split by resource, so a tenant is left alone (`off`) only
    when every resource it holds there says so."""
    listed = list(modes)
    if not listed or any(m is None for m in listed):
        return None
    return max((m for m in listed if m is not None), key=_ACTING.__getitem__)


GuardAction = Literal["kill", "evict"]
"""How a reclaim is carried out: signal the container's processes, or the Eviction API."""

DecisionKind = Literal["over-share", "reclaim", "escalate"]
"""`over-share`: a container went over its share (once per crossing, for Events and logs);
`reclaim`: stop it (SIGTERM or eviction); `escalate`: it outlived the grace after `reclaim`
(SIGKILL)."""

ReclaimReason = Literal["memory-pressure", "strict", "over-cap"]
"""`over-cap`: it holds more than the hard limit its cap confirmed (`Tenant.hard_bytes`)."""


@dataclass(frozen=True, slots=True, order=True)
class ContainerKey:
    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One physical GPU's memory as the last poll saw it."""

    uuid: str
    index: int | None
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class Tenant:
    """One container on one physical GPU: its usage and what it is entitled to."""

    key: ContainerKey
    gpu_uuid: str
    kind: SharingStrategy
    """`time-slicing` and `mps` tenants (`shares_memory`) can be reclaimed (an MPS client
    can unset its own limit, and a container can run several); `mig` and `exclusive` ones
    are exempt."""
    share_bytes: int
    used_bytes: int
    pids: tuple[int, ...] = ()
    mode: GuardMode | None = None
    """Its holder's own mode (a DRA claim's GuardConfig `mode`); None: the node's. It can
    only lower the node's mode (`effective_mode`)."""
    holder: str | None = None
    """What reserved the memory it uses, when that is not the container alone: a DRA share
    claim (`claim:<ns>/<name>`) several containers consume (`core.protection`). Tenants
    with one holder on one GPU are held together to `share_bytes`, the holder's share."""
    hard_bytes: int | None = None
    """The hard limit the driver was confirmed to hold it to, when it uses more (the memory
    it allocated before the limit was set; `core.protection.in_guard_view`). Memory above a
    hard limit may be what the driver holds back for the others' soft limits, which free
    memory does not show: so it is reclaimed after the grace, whatever the free memory."""

    @property
    def overrun_bytes(self) -> int:
        return self.used_bytes - self.share_bytes


@dataclass(frozen=True, slots=True)
class Reserve:
    """Free memory the guard keeps on each GPU: a byte count, a fraction of the GPU, or both
    (the larger wins). A reserve of zero only acts once the GPU is completely full, when
    neighbours are already failing their allocations."""

    bytes: int = 0
    fraction: float = 0.0

    def of(self, total_bytes: int) -> int:
        return max(self.bytes, int(total_bytes * self.fraction))

    @classmethod
    def parse(cls, text: str, field_name: str = "memory-guard-reserve") -> Reserve:
        """`10%`, a byte count (`4294967296`) or a size with a binary unit (`4Gi`, `512MiB`)."""
        value = text.strip()
        match = _RESERVE.fullmatch(value)
        if match is None and value.endswith("%"):
            raise GpusliceError(f"{field_name}: a percentage must be 0..<100, got {text!r}")
        if match is None:
            raise GpusliceError(
                f"{field_name}: expected a percentage of the GPU (10%), bytes (4294967296) "
                f"or a size (4Gi, 512MiB), got {text!r}"
            )
        percent, number, unit = match.groups()
        if percent is not None:
            return cls(fraction=float(percent) / 100.0)
        return cls(bytes=int(float(number) * _UNITS[(unit or "").lower().removesuffix("b")]))

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction else f"{self.bytes}B"


RESERVE_PATTERN = r"(\d{1,2}(?:\.\d+)?)\s*%|(\d+(?:\.\d+)?)\s*([KkMmGgTt][Ii][Bb]?|[Bb])?"
"""What `Reserve.parse` reads, whole (after stripping), in the syntax JSON Schema's `pattern`
and Python share (no flags, no named groups): the chart's values schema checks
`memoryGuard.reserve` with this same pattern, so a value the agent would refuse fails
`helm install` instead of crash-looping the agent."""
_RESERVE = re.compile(RESERVE_PATTERN)
_UNITS = {"": 1, **{suffix.lower(): scale for suffix, scale in BINARY_SUFFIXES.items()}}
"""`_RESERVE` admits KiB to TiB, in any case."""


EXIT_ALLOWANCE_S = 0.25
"""About the time a signalled process takes to exit and free its GPU memory: added to the
poll interval for `GuardParams.lookahead_s`."""


def lookahead_for(interval_s: float) -> float:
    """The lookahead the agent uses for a poll interval (see `GuardParams.lookahead_s`)."""
    return interval_s + EXIT_ALLOWANCE_S


@dataclass(frozen=True, slots=True)
class GuardParams:
    mode: GuardMode = "observe"
    reserve: Reserve = field(default_factory=lambda: Reserve(fraction=0.10))
    """Default 10 % of each GPU: on a 48 GiB L40S a leaker must grow 4.8 GiB within one poll
    plus the grace to push a neighbour into OOM."""
    grace_s: float = 1.0
    """Seconds the pressure (or, in strict mode, the overrun) must last before a reclaim,
    and seconds between SIGTERM and SIGKILL. Filters short spikes; widens the window in which
    a fast leaker can still hurt a neighbour (see docs/memory-guard.md)."""
    critical: float = 0.5
    """Below reserve x this, the grace is skipped: a dip that deep is no short spike, and
    the next neighbour to allocate is about to fail. Keeps the grace for shallow dips
    without letting a fast leak use it."""
    hysteresis: float = 0.25
    """Pressure on a GPU ends only once free memory is back above reserve x (1 + this), so
    free memory hovering at the reserve does not restart the grace clock on every poll."""
    strict: bool = False
    """Stop any time-sliced container over its share after the grace, whatever the free
    memory (tenants that must not borrow)."""
    lookahead_s: float = 1.25
    """Seconds beyond the grace for which the guard projects each GPU's free memory, at the
    rate the containers over their share on it grew since the previous poll: a GPU
    projected to go below the reserve within grace + lookahead is under pressure now (its
    grace clock starts). Without it a leak is seen up to a poll late and then waits out the
    grace, so only leaks slower than reserve / (poll + grace + exit time) were safe. Only
    borrowing is projected: a pod growing within its share (a model loading) is entitled to
    that memory and does not make a stable borrower a victim early. The agent sets this to
    the poll interval plus 0.25 s (about the time a signalled process takes to free its
    memory); 0 turns projection off. The deep-dip shortcut (`critical`) still looks at the
    memory actually free, and a burst that stops projects nothing."""


@dataclass(frozen=True, slots=True)
class GuardState:
    """What one evaluation hands to the next (plain data; the adapter only stores it)."""

    pressure_since: Mapping[str, float] = field(default_factory=dict)
    """GPU UUID -> when its free memory fell below the reserve (cleared with hysteresis)."""
    over_since: Mapping[tuple[ContainerKey, str], float] = field(default_factory=dict)
    """(container, GPU) -> when it went over its share."""
    stopping: Mapping[ContainerKey, float] = field(default_factory=dict)
    """Container -> when it was reclaimed; its memory counts as being freed meanwhile."""
    escalated: frozenset[ContainerKey] = frozenset()
    reported: frozenset[ContainerKey] = frozenset()
    """Observe mode: would-be victims already reported, not repeated on every poll while
    they stay victims."""
    last_used: Mapping[tuple[ContainerKey, str], tuple[float, int]] = field(default_factory=dict)
    """(container, GPU) -> (when, bytes used) at the previous poll: how fast borrowers grow."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One thing the guard decided about one container on one GPU (logged and posted)."""

    kind: DecisionKind
    key: ContainerKey
    gpu_uuid: str
    gpu_index: int | None
    used_bytes: int
    share_bytes: int
    free_bytes: int
    reserve_bytes: int
    enforced: bool
    """False in observe mode (the node's, or the tenant's own): the decision is only
    reported."""
    reason: ReclaimReason | None = None
    pids: tuple[int, ...] = ()
    borrowing_growth_bytes_per_s: int = 0
    """How fast the containers over their share on this GPU grew since the previous poll; a
    reclaim with free memory still above the reserve is one projected to cross it."""
    holder: str | None = None
    """The claim whose share it consumes with other containers (`Tenant.holder`): then
    `share_bytes` is the claim's, and `holder_used_bytes` what its consumers use together."""
    holder_used_bytes: int | None = None
