"""Placing a MIG layout on a simulated GPU the way NVIDIA's driver would.

A layout the driver would refuse must be refused here too, with a message that says what
would fit; otherwise a config tested against the simulator fails on the real node.

Rules (MIG User Guide): instances may not overlap in memory slices and must sit at one of
their profile's placement starts; compute slices add up to at most 7 (4 on A30); a profile
has a maximum instance count; at most one `+me` instance (it takes the only OFA/JPEG).

Placement order: larger profiles first. Within a profile, multi-slice instances take the
highest free start and single-slice ones the lowest: that reproduces the guide's examples
(3g+3g at 4:4 then 0:4; 3-2-1-1 as 4:4, 2:2, 0:1, 1:1; 2-1-1-1-1-1 with the 2g at 4:2 and the
1g at 0,1,2,3,6; 4g+2g+1g at 0:4, 4:2, 6:1). Plain "lowest start first" would wrongly refuse
3-2-1-1. When that preference dead-ends, a small backtracking search finds any placement
that exists, since the driver accepts any layout for which one exists when given placements.

GPU instance IDs are modelled, not guaranteed to match a given driver: each instance takes
the lowest free ID from a base by size (7g 0, 4g/3g 1, 2g 3, 1g 7 on 8-slice GPUs; seven
1g instances created in a row get 7..13, as real output shows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice.backends.simulated.models import MODELS, GpuModel, MigGeometry, MigProfile
from gpuslice.ports import BackendError

_ITEM = re.compile(r"^(?P<name>[0-9a-z.+]+?)(?:\*(?P<count>\d+))?$")


@dataclass(frozen=True, slots=True)
class PlacedInstance:
    profile: MigProfile
    start: int
    gi_id: int
    ci_id: int = 0


def describe_profiles(geometry: MigGeometry) -> str:
    return ", ".join(f"{p.name}*{p.max_instances}" for p in geometry.profiles)


def parse_layout(text: str, model: GpuModel) -> tuple[MigProfile, ...]:
    """`3g.20gb*1+2g.10gb+1g.5gb*2`, or `all-<profile>` (mig-parted's names: the maximum count).

    An empty layout means MIG mode on with no instances yet.
    """
    geometry = _geometry(model)
    text = text.strip()
    if text in ("", "none"):
        return ()
    if text.startswith("all-"):
        profile = _profile(text.removeprefix("all-"), text, model, geometry)
        return (profile,) * profile.max_instances
    out: list[MigProfile] = []
    for item in text.split("+"):
        if item == "me" and out:
            # `1g.5gb+me*1` splits as `1g.5gb` and `me*1`: rejoin (count on the +me part).
            out[-1] = _profile(out[-1].name + "+me", text, model, geometry)
            continue
        if item.startswith("me*") and out:
            base = out.pop()
            count = _count(item.removeprefix("me*"), text)
            out.extend([_profile(base.name + "+me", text, model, geometry)] * count)
            continue
        m = _ITEM.match(item)
        if m is None:
            raise BackendError(
                f"MIG layout {text!r}: cannot read {item!r}; write PROFILE*COUNT joined by '+', "
                f"e.g. 3g.20gb*1+1g.5gb*2, or all-PROFILE"
            )
        count = _count(m.group("count") or "1", text)
        out.extend([_profile(m.group("name"), text, model, geometry)] * count)
    return tuple(out)


def place(text: str, model: GpuModel) -> tuple[PlacedInstance, ...]:
    """Parse and place a layout; raise BackendError saying what fits when it does not."""
    geometry = _geometry(model)
    wanted = parse_layout(text, model)
    _check_counts(text, model, geometry, wanted)
    order = sorted(wanted, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    starts = _search(order, geometry.memory_slices)
    if starts is None:
        raise BackendError(_no_placement_message(text, model, geometry, order))
    used_ids: set[int] = set()
    placed: list[PlacedInstance] = []
    for profile, start in zip(order, starts, strict=True):
        gi = _gi_id(profile, geometry, used_ids)
        used_ids.add(gi)
        placed.append(PlacedInstance(profile, start, gi))
    return tuple(sorted(placed, key=lambda p: p.gi_id))


def _geometry(model: GpuModel) -> MigGeometry:
    if model.mig is None:
        raise BackendError(
            f"{model.key} ({model.product_name}) does not support MIG; MIG models: "
            + ", ".join(sorted(k for k, m in MODELS.items() if m.mig is not None))
        )
    return model.mig


def _count(text: str, layout: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 1:
        raise BackendError(f"MIG layout {layout!r}: count {text!r} must be a whole number >= 1")
    return count


def _profile(name: str, layout: str, model: GpuModel, geometry: MigGeometry) -> MigProfile:
    if name.endswith(".me"):
        name = name.removesuffix(".me") + "+me"  # mig-parted spells `1g.5gb+me` `1g.5gb.me`
    profile = geometry.profile(name)
    if profile is None:
        raise BackendError(
            f"MIG layout {layout!r}: {model.product_name} has no profile {name!r}; "
            f"its profiles (with max counts): {describe_profiles(geometry)}"
        )
    return profile


def _check_counts(
    text: str, model: GpuModel, geometry: MigGeometry, wanted: tuple[MigProfile, ...]
) -> None:
    prefix = f"MIG layout {text!r} does not fit {model.product_name}"
    for profile in dict.fromkeys(wanted):
        n = wanted.count(profile)
        if n > profile.max_instances:
            raise BackendError(
                f"{prefix}: {n}x {profile.name} asked, at most {profile.max_instances} fit; "
                f"profiles (with max counts): {describe_profiles(geometry)}"
            )
    me = [p.name for p in wanted if p.media_extensions]
    if len(me) > 1:
        raise BackendError(f"{prefix}: at most one +me instance per GPU (asked: {', '.join(me)})")
    compute = sum(p.compute_slices for p in wanted)
    if compute > geometry.compute_slices:
        raise BackendError(
            f"{prefix}: it needs {compute} compute slices, the GPU has "
            f"{geometry.compute_slices}; profiles (with max counts): "
            f"{describe_profiles(geometry)}"
        )
    memory = sum(p.memory_slices for p in wanted)
    if memory > geometry.memory_slices:
        raise BackendError(
            f"{prefix}: it needs {memory} memory slices, the GPU has "
            f"{geometry.memory_slices}; profiles (with max counts): "
            f"{describe_profiles(geometry)}"
        )


def _preferred_starts(profile: MigProfile) -> tuple[int, ...]:
    if profile.memory_slices > 1:
        return tuple(sorted(profile.starts, reverse=True))
    return tuple(sorted(profile.starts))


def _search(order: list[MigProfile], memory_slices: int) -> list[int] | None:
    """Depth-first over placements in preference order; layouts are at most 7 deep."""
    used = [False] * memory_slices
    chosen: list[int] = []

    def fits(p: MigProfile, start: int) -> bool:
        end = start + p.memory_slices
        return end <= memory_slices and not any(used[start:end])

    def step(i: int) -> bool:
        if i == len(order):
            return True
        p = order[i]
        for start in _preferred_starts(p):
            # Identical profiles in a row are interchangeable: keep their starts ordered
            # so the search does not retry permutations of the same placement.
            if i > 0 and order[i - 1] == p and not _after(p, chosen[-1], start):
                continue
            if not fits(p, start):
                continue
            used[start : start + p.memory_slices] = [True] * p.memory_slices
            chosen.append(start)
            if step(i + 1):
                return True
            chosen.pop()
            used[start : start + p.memory_slices] = [False] * p.memory_slices
        return False

    return chosen if step(0) else None


def _after(profile: MigProfile, previous: int, start: int) -> bool:
    return start < previous if profile.memory_slices > 1 else start > previous


def gi_id_for(profile: MigProfile, geometry: MigGeometry, used: set[int]) -> int:
    """The GPU instance ID the modelled driver gives a new instance of `profile`."""
    return _gi_id(profile, geometry, used)


def _gi_id(profile: MigProfile, geometry: MigGeometry, used: set[int]) -> int:
    full = geometry.compute_slices
    if profile.compute_slices == full:
        base = 0
    elif geometry.memory_slices == 8:
        base = {4: 1, 3: 1, 2: 3}.get(profile.compute_slices, 7)
    else:
        base = {2: 1}.get(profile.compute_slices, 3)
    gi = base
    while gi in used:
        gi += 1
    return gi


def _no_placement_message(
    text: str, model: GpuModel, geometry: MigGeometry, order: list[MigProfile]
) -> str:
    """Greedy partial placement, so the message can say what was left for what."""
    used = [False] * geometry.memory_slices
    placed: list[str] = []
    for p in order:
        for start in _preferred_starts(p):
            end = start + p.memory_slices
            if end <= geometry.memory_slices and not any(used[start:end]):
                used[start:end] = [True] * p.memory_slices
                placed.append(f"{p.name}@{start}:{p.memory_slices}")
                break
        else:
            free = [str(i) for i, u in enumerate(used) if not u] or ["none"]
            starts = ",".join(str(s) for s in p.starts)
            return (
                f"MIG layout {text!r} does not fit {model.product_name}: no free placement "
                f"for {p.name} (placements {{{starts}}}:{p.memory_slices}) after "
                f"{', '.join(placed) or 'nothing'}; free memory slices: {', '.join(free)}; "
                f"profiles (with max counts): {describe_profiles(geometry)}"
            )
    return f"MIG layout {text!r} does not fit {model.product_name}"
