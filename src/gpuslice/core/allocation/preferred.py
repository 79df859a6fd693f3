"""Which devices to hand out when the kubelet asks (GetPreferredAllocation).

Two policies, as in NVIDIA's plugin:

* shared resources (replicas) and MIG devices: a greedy pick that spreads replicas over the
  least-loaded physical devices (`distributed`, the default) or fills the busiest first
  (`packed`), so equal requests land on GPUs in a predictable way;
* whole GPUs: the best-linked set (NVLink, then PCIe proximity), so a multi-GPU job gets
  GPUs that can talk to each other fast.

Unlike NVIDIA's greedy sort (unstable before v0.20), every tie here ends at device order, so
the same request always gets the same answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from gpuslice.core.devices import Inventory, Link, P2PLevel
from gpuslice.core.errors import AllocationError
from gpuslice.core.sharing.model import AdvertisedDevice, AllocationPolicy, ResourcePlan
from gpuslice.core.text import shown_all

P2P_POINTS: dict[P2PLevel, int] = {
    "cross-cpu": 10,
    "same-cpu": 20,
    "host-bridge": 30,
    "multi-switch": 40,
    "single-switch": 50,
    "same-board": 60,
}
NVLINK_POINTS = 100
"""Per NVLink between the pair, on top of the PCIe points (go-gpuallocator's scores)."""

EXHAUSTIVE_LIMIT = 20_000
"""Most candidate sets scored exhaustively (C(16, 8) = 12,870 fits); above it, greedy."""

NOT_ENOUGH = "not enough available devices to satisfy allocation"


def preferred_allocation(
    resource: ResourcePlan,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    policy: AllocationPolicy,
    inventory: Inventory,
) -> list[str]:
    """The IDs to prefer: `must_include` first, then the chosen ones.

    AllocationError for IDs the resource does not advertise, for `must_include` IDs missing
    from `available` (so the answer only ever holds available IDs), or (shared/MIG resources) when
    fewer than `size` devices are available. For whole GPUs an impossible request yields an
    empty list, as NVIDIA's aligned policy does: the kubelet then picks by itself.
    """
    by_id: dict[str, tuple[int, AdvertisedDevice]] = {
        dev.id: (pos, dev) for pos, dev in enumerate(resource.devices)
    }
    unknown = [i for i in (*available, *must_include) if i not in by_id]
    if unknown:
        raise AllocationError(
            f'preferred allocation for "{resource.name}": unknown device(s): {shown_all(unknown)}'
        )
    avail = list(dict.fromkeys(available))
    required = list(dict.fromkeys(must_include))
    offered = set(avail)
    missing = [i for i in required if i not in offered]
    if missing:
        # The kubelet builds must_include from available; an answer holding other IDs
        # would hand out devices the kubelet does not consider free.
        raise AllocationError(
            f'preferred allocation for "{resource.name}": must_include device(s) not in '
            f"available: {shown_all(missing)}"
        )
    aligned = all(dev.replica is None and dev.physical.kind == "gpu" for _, dev in by_id.values())
    if aligned:
        return _best_linked(resource, avail, required, size, inventory, by_id)
    return _greedy(resource, avail, required, size, policy, by_id)


def _greedy(
    resource: ResourcePlan,
    available: list[str],
    required: list[str],
    size: int,
    policy: AllocationPolicy,
    by_id: dict[str, tuple[int, AdvertisedDevice]],
) -> list[str]:
    required_set = set(required)
    candidates = [i for i in available if i not in required_set]
    needed = size - len(required)
    if needed <= 0:
        return list(required)
    if len(candidates) < needed:
        raise AllocationError(NOT_ENOUGH)
    total: dict[str, int] = {}
    for dev in resource.devices:
        total[dev.physical.uuid] = total.get(dev.physical.uuid, 0) + 1
    free: dict[str, int] = {}
    for c in candidates:
        phys = by_id[c][1].physical.uuid
        free[phys] = free.get(phys, 0) + 1
    picked_from: dict[str, int] = {}
    sign = 1 if policy == "distributed" else -1

    def rank(device_id: str) -> tuple[int, int, int]:
        pos, dev = by_id[device_id]
        phys = dev.physical.uuid
        allocated = total[phys] - free[phys]
        return (sign * allocated, picked_from.get(phys, 0), pos)

    picks: list[str] = []
    remaining = list(candidates)
    for _ in range(needed):
        best = min(remaining, key=rank)
        remaining.remove(best)
        phys = by_id[best][1].physical.uuid
        free[phys] -= 1
        picked_from[phys] = picked_from.get(phys, 0) + 1
        picks.append(best)
    return [*required, *picks]


def pair_score(inventory: Inventory, a: str, b: str) -> int:
    """go-gpuallocator's pair score: PCIe proximity points plus 100 per NVLink."""
    link = inventory.link(a, b)
    return 0 if link is None else _link_points(link)


def _link_points(link: Link) -> int:
    return P2P_POINTS.get(link.p2p, 0) + NVLINK_POINTS * link.nvlinks


def _best_linked(
    resource: ResourcePlan,
    available: list[str],
    required: list[str],
    size: int,
    inventory: Inventory,
    by_id: dict[str, tuple[int, AdvertisedDevice]],
) -> list[str]:
    """The `size`-set containing `required` with the highest summed pair score.

    NVIDIA scores whole partitions of the available GPUs (to limit fragmentation for later
    requests); we score the requested set alone, which is what the user asked for and keeps
    the cost bounded. Ties go to the lowest GPU indices, so unknown topology (no links)
    means lowest indices first. Up to `EXHAUSTIVE_LIMIT` sets are scored exhaustively;
    beyond that (e.g. 8 of 64 GPUs) the set is grown greedily, see `_grow`.
    """
    if size <= 0 or len(available) < size or len(required) > size:
        return []
    required_set = set(required)

    def order(device_id: str) -> tuple[int, int]:
        pos, dev = by_id[device_id]
        return (dev.physical.gpu_index, pos)

    candidates = sorted((i for i in available if i not in required_set), key=order)
    needed = size - len(required)
    if needed <= 0:
        return list(required)
    if len(candidates) < needed:
        return []
    uuid = {i: by_id[i][1].physical.uuid for i in (*candidates, *required)}
    table: dict[frozenset[str], int] = {}
    for link in inventory.links:
        table[frozenset((link.a, link.b))] = _link_points(link)

    def score(a: str, b: str) -> int:
        return table.get(frozenset((uuid[a], uuid[b])), 0)

    if math.comb(len(candidates), needed) > EXHAUSTIVE_LIMIT:
        return [*required, *sorted(_grow(required, candidates, size, score), key=order)]
    base = sum(score(a, b) for a, b in itertools.combinations(required, 2))
    best: tuple[str, ...] = ()
    best_score = -1
    for combo in itertools.combinations(candidates, needed):
        total = base + sum(score(r, c) for r in required for c in combo)
        total += sum(score(a, b) for a, b in itertools.combinations(combo, 2))
        if total > best_score:
            best, best_score = combo, total
    return [*required, *best]


def _grow(
    required: list[str], candidates: list[str], size: int, score: Callable[[str, str], int]
) -> list[str]:
    """Greedy set growth for large nodes; returns the picks (not `required`).

    Without required GPUs, the seed is the GPU whose best `size - 1` links score highest
    (a member of a well-linked island of the right size); then each step adds the GPU
    with the most points to the set so far. Ties go to candidate order (lowest index).
    """
    chosen = list(required)
    pool = list(candidates)
    picks: list[str] = []
    while len(chosen) < size:
        gains: list[tuple[int, int]] = []
        for pos, device_id in enumerate(pool):
            if chosen:
                gain = sum(score(device_id, c) for c in chosen)
            else:
                links = sorted((score(device_id, o) for o in pool if o != device_id), reverse=True)
                gain = sum(links[: size - 1])
            gains.append((-gain, pos))
        _, pos = min(gains)
        picks.append(pool.pop(pos))
        chosen.append(picks[-1])
    return picks
