"""GetPreferredAllocation: greedy spreading/packing of replicas, best-linked whole GPUs."""

from __future__ import annotations

import itertools

import pytest

from gpuslice.core.allocation import preferred_allocation
from gpuslice.core.devices import Gpu, Inventory, Link, P2PLevel
from gpuslice.core.errors import AllocationError
from gpuslice.core.sharing.model import AllocationPolicy, ResourcePlan, split_replica_id
from tests.core.allocation.alloc_plans import exclusive, gpu, mig, mig_gpu, shared, whole


def inventory(gpus: list[Gpu], links: tuple[Link, ...] = ()) -> Inventory:
    return Inventory(
        gpus=tuple(gpus), driver_version="550.54.15", cuda_driver_version=12040, links=links
    )


G = [gpu(i) for i in range(4)]
INV = inventory(G)
TWO_BY_FOUR = shared([whole(G[0]), whole(G[1])], 4)


def base(device_id: str) -> str:
    return split_replica_id(device_id)[0]


def pick_one_at_a_time(resource: ResourcePlan, policy: AllocationPolicy, n: int) -> list[str]:
    """Like the kubelet: each request sees only what earlier ones left available."""
    free: list[str] = [d.id for d in resource.devices]
    taken = []
    for _ in range(n):
        [pick] = preferred_allocation(resource, free, [], 1, policy=policy, inventory=INV)
        free.remove(pick)
        taken.append(pick)
    return taken


def test_distributed_alternates_gpus_one_request_at_a_time() -> None:
    taken = pick_one_at_a_time(TWO_BY_FOUR, "distributed", 4)
    assert [base(t) for t in taken] == ["GPU-0000", "GPU-0001", "GPU-0000", "GPU-0001"]
    assert len(set(taken)) == 4


def test_packed_fills_one_gpu_first() -> None:
    taken = pick_one_at_a_time(TWO_BY_FOUR, "packed", 5)
    assert [base(t) for t in taken] == ["GPU-0000"] * 4 + ["GPU-0001"]


def test_distributed_prefers_the_least_used_gpu_and_packed_the_most_used() -> None:
    # Three replicas of GPU 0 are in use; only its last replica is still free.
    free = ["GPU-0000::3", *(f"GPU-0001::{n}" for n in range(4))]
    args = {"inventory": INV}
    dist = preferred_allocation(TWO_BY_FOUR, free, [], 1, policy="distributed", **args)
    packed = preferred_allocation(TWO_BY_FOUR, free, [], 1, policy="packed", **args)
    assert dist == ["GPU-0001::0"]
    assert packed == ["GPU-0000::3"]


def test_tie_break_by_picks_this_round_spreads_a_multi_replica_request() -> None:
    # GPU 1 has one replica in use. A request for 2: first GPU 0 (0 in use); then both
    # have 1 in use and GPU 0 already gave one this round, so GPU 1 goes next.
    res = shared([whole(G[0]), whole(G[1])], 4, fail_over_one=False)
    free = [d.id for d in res.devices if d.id != "GPU-0001::0"]
    got = preferred_allocation(res, free, [], 2, policy="distributed", inventory=INV)
    assert got == ["GPU-0000::0", "GPU-0001::1"]


def test_must_include_comes_first_and_counts_as_allocated() -> None:
    res = shared([whole(G[0]), whole(G[1])], 4, fail_over_one=False)
    free = [d.id for d in res.devices]
    got = preferred_allocation(res, free, ["GPU-0000::2"], 3, policy="distributed", inventory=INV)
    assert got[0] == "GPU-0000::2"
    assert len(got) == 3
    assert [base(g) for g in got[1:]] == ["GPU-0001", "GPU-0000"]


def test_result_does_not_depend_on_available_order() -> None:
    free = [d.id for d in TWO_BY_FOUR.devices]
    for shuffled in (free, free[::-1], free[3:] + free[:3]):
        got = preferred_allocation(
            TWO_BY_FOUR, shuffled, [], 1, policy="distributed", inventory=INV
        )
        assert got == ["GPU-0000::0"]


def test_not_enough_candidates_is_an_error() -> None:
    with pytest.raises(
        AllocationError, match=r"^not enough available devices to satisfy allocation$"
    ):
        preferred_allocation(
            TWO_BY_FOUR, ["GPU-0000::0"], [], 2, policy="distributed", inventory=INV
        )


def test_unknown_ids_are_named() -> None:
    with pytest.raises(AllocationError, match=r"GPU-0000::9, GPU-zz"):
        preferred_allocation(
            TWO_BY_FOUR,
            ["GPU-0000::0", "GPU-0000::9"],
            ["GPU-zz"],
            1,
            policy="distributed",
            inventory=INV,
        )


def test_mig_resource_uses_device_order() -> None:
    a100 = mig_gpu(0, [("1g.5gb", 7, 0, 4864, 14), ("1g.5gb", 8, 0, 4864, 14)])
    res = exclusive([mig(a100, 0), mig(a100, 1)], name="nvidia.com/mig-1g.5gb")
    inv = inventory([a100])
    assert preferred_allocation(
        res, ["MIG-0001", "MIG-0000"], [], 1, policy="distributed", inventory=inv
    ) == ["MIG-0000"]


# --- whole GPUs: best-linked sets --------------------------------------------------------


def link(a: int, b: int, p2p: P2PLevel, nvlinks: int = 0) -> Link:
    return Link(G8[a].uuid, G8[b].uuid, p2p, nvlinks)


G8 = [gpu(i) for i in range(8)]
WHOLE8 = exclusive([whole(g) for g in G8])


def whole_pick(
    available: list[int], must: list[int], size: int, links: tuple[Link, ...]
) -> list[str]:
    return preferred_allocation(
        WHOLE8,
        [G8[i].uuid for i in available],
        [G8[i].uuid for i in must],
        size,
        policy="distributed",
        inventory=inventory(G8, links),
    )


def pcie_mesh(n: int, level: P2PLevel = "same-cpu") -> list[Link]:
    return [link(a, b, level) for a, b in itertools.combinations(range(n), 2)]


def test_nvlink_pair_chosen_over_pcie_pair() -> None:
    links = [link(0, 1, "single-switch"), link(2, 3, "cross-cpu", nvlinks=2)]
    links += [link(a, b, "cross-cpu") for a, b in [(0, 2), (0, 3), (1, 2), (1, 3)]]
    assert whole_pick([0, 1, 2, 3], [], 2, tuple(links)) == [G8[2].uuid, G8[3].uuid]


def test_must_include_picks_its_best_partner() -> None:
    links = pcie_mesh(4)
    links[links.index(link(1, 3, "same-cpu"))] = link(1, 3, "same-cpu", 4)
    assert whole_pick([0, 1, 2, 3], [1], 2, tuple(links)) == [G8[1].uuid, G8[3].uuid]


def test_same_switch_beats_same_cpu_and_cross_cpu_for_a_set_of_four() -> None:
    # GPUs 0-3 on CPU 0 (same-cpu), 4-7 on CPU 1 behind one switch (single-switch).
    def level(a: int, b: int) -> P2PLevel:
        if (a < 4) != (b < 4):
            return "cross-cpu"
        return "same-cpu" if a < 4 else "single-switch"

    links = tuple(link(a, b, level(a, b)) for a, b in itertools.combinations(range(8), 2))
    assert whole_pick(list(range(8)), [], 4, links) == [g.uuid for g in G8[4:8]]
    assert whole_pick(list(range(8)), [0], 2, links) == [G8[0].uuid, G8[1].uuid]


def test_best_set_beats_the_set_around_the_strongest_pair() -> None:
    # 0-1 is the strongest pair (6 NVLinks, 660 points), but 2-3-4 is a triangle of
    # 2-NVLink pairs: 780 points against 680 for {0, 1, any}. A set grown greedily from
    # GPU 0 (the best-linked single GPU) would miss it; the exhaustive search does not.
    links = [link(a, b, "cross-cpu") for a, b in itertools.combinations(range(5), 2)]
    links += [link(0, 1, "same-board", 6)]
    links += [link(a, b, "same-board", 2) for a, b in [(2, 3), (2, 4), (3, 4)]]
    # One link per pair: the later, stronger entries replace the cross-cpu ones.
    unique = {frozenset((x.a, x.b)): x for x in links}
    got = whole_pick([0, 1, 2, 3, 4], [], 3, tuple(unique.values()))
    assert got == [G8[2].uuid, G8[3].uuid, G8[4].uuid]


def test_unknown_topology_gives_lowest_indices() -> None:
    assert whole_pick([5, 3, 7, 1], [], 2, ()) == [G8[1].uuid, G8[3].uuid]


@pytest.mark.parametrize(
    ("available", "must", "size"),
    [([0, 1], [], 0), ([0, 1], [], -1), ([0], [], 2), ([0, 1, 2], [0, 1, 2], 2)],
)
def test_impossible_whole_gpu_requests_give_empty(
    available: list[int], must: list[int], size: int
) -> None:
    assert whole_pick(available, must, size, ()) == []


def test_large_node_uses_greedy_growth_and_finds_an_nvlink_island() -> None:
    gpus = [gpu(i) for i in range(32)]
    res = exclusive([whole(g) for g in gpus])
    links = tuple(
        Link(gpus[a].uuid, gpus[b].uuid, "same-cpu", 12 if a // 8 == b // 8 else 0)
        for a, b in itertools.combinations(range(32), 2)
    )
    # GPUs 4..27 free: only island 8-15 and 16-23 are complete.
    free = [g.uuid for g in gpus[4:28]]
    got = preferred_allocation(
        res, free, [], 8, policy="distributed", inventory=inventory(gpus, links)
    )
    assert got == [g.uuid for g in gpus[8:16]]
