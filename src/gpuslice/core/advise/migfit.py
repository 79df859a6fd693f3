"""MIG: the smallest profile each pod fits, and GPUs partitioned to hold them all.

The profiles are the simulator's tables (`core.gpumodels`), so a layout proposed here is
one the simulated node accepts (`sim:...` with `mig=`), and tests check that it does. The
count of each profile is the most pods needing it that ran at one time: any moment of
the history then finds an instance free for each running pod. Instances go onto GPUs
largest first, each at the first placement start whose memory slices are free, within
the profile's instance limit and the GPU's compute slices; `+me` profiles are never
proposed (a pod needing no media engines should not take the only one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.core.advise.sizing import need_mib
from gpuslice.core.advise.stats import PodStats
from gpuslice.core.gpumodels import MigGeometry, MigProfile


@dataclass(frozen=True, slots=True)
class MigFit:
    pod: str
    container: str
    profile: str | None
    """None: no profile holds it (it needs more than the whole GPU)."""
    why: str


@dataclass(frozen=True, slots=True)
class MigPlan:
    fits: tuple[MigFit, ...]
    layouts: tuple[str, ...]
    """One layout per GPU, as `gpuslice`'s simulated node spells it (`2g.20gb*2+1g.10gb`)."""
    counts: tuple[tuple[str, int], ...]
    """Instances of each profile: the most pods needing it that ran at one time."""
    why: tuple[str, ...]


def smallest_profile(geometry: MigGeometry, need: int) -> MigProfile | None:
    usable = [p for p in geometry.profiles if not p.media_extensions and p.memory_mib >= need]
    return min(usable, key=lambda p: (p.memory_mib, p.compute_slices, p.name), default=None)


def plan_mig(sized: Sequence[PodStats], geometry: MigGeometry, headroom_percent: float) -> MigPlan:
    fits: list[MigFit] = []
    intervals: dict[str, list[tuple[int, int]]] = {}
    for s in sorted(sized, key=lambda s: (s.name, s.trace.key.container)):
        need = need_mib(s.peak_mib, headroom_percent)
        profile = smallest_profile(geometry, need)
        if profile is None:
            reason = f"needs {need} MiB: more than any MIG profile holds"
        else:
            reason = f"needs {need} MiB; {profile.name} holds {profile.memory_mib} MiB"
            intervals.setdefault(profile.name, []).append((s.trace.first, s.trace.last))
        fits.append(
            MigFit(s.name, s.trace.key.container, None if profile is None else profile.name, reason)
        )
    counts = {name: _most_at_once(spans) for name, spans in intervals.items()}
    wanted = [p for p in geometry.profiles for _ in range(counts.get(p.name, 0))]
    layouts = _pack(wanted, geometry)
    why = [
        f"{n} x {name}: the most pods needing it that ran at one time"
        for name, n in sorted(counts.items())
    ]
    if layouts:
        why.append(f"{len(layouts)} GPU(s), placed as the MIG placement rules allow")
    return MigPlan(tuple(fits), tuple(layouts), tuple(sorted(counts.items())), tuple(why))


def _most_at_once(spans: Sequence[tuple[int, int]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b + 1, -1) for _, b in spans])
    most = running = 0
    for _, delta in edges:
        running += delta
        most = max(most, running)
    return most


@dataclass(slots=True)
class _Gpu:
    slices: list[bool]
    compute: int = 0
    placed: list[MigProfile] | None = None


def _pack(wanted: Sequence[MigProfile], geometry: MigGeometry) -> list[str]:
    gpus: list[_Gpu] = []
    for profile in sorted(wanted, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name)):
        for gpu in gpus:
            if _place(gpu, profile, geometry):
                break
        else:
            gpu = _Gpu([False] * geometry.memory_slices, 0, [])
            gpus.append(gpu)
            if not _place(gpu, profile, geometry):
                raise AssertionError(f"{profile.name} does not fit an empty GPU")
    return [_spell(g.placed or []) for g in gpus]


def _place(gpu: _Gpu, profile: MigProfile, geometry: MigGeometry) -> bool:
    placed = gpu.placed if gpu.placed is not None else []
    if sum(1 for p in placed if p.name == profile.name) >= profile.max_instances:
        return False
    if gpu.compute + profile.compute_slices > geometry.compute_slices:
        return False
    for start in profile.starts:
        span = range(start, start + profile.memory_slices)
        if span.stop <= len(gpu.slices) and not any(gpu.slices[i] for i in span):
            for i in span:
                gpu.slices[i] = True
            gpu.compute += profile.compute_slices
            placed.append(profile)
            gpu.placed = placed
            return True
    return False


def _spell(placed: Sequence[MigProfile]) -> str:
    counts: dict[str, int] = {}
    for p in placed:
        counts[p.name] = counts.get(p.name, 0) + 1
    return "+".join(f"{name}*{n}" for name, n in counts.items())
