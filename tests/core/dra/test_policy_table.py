"""The policy table of a plan snapshot (`core.policy`): built with the snapshot, kept while
the plan and the inventory stay, and one offer for every reader that asks the same."""

from __future__ import annotations

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.publish import SharesMode
from gpuslice.core.policy import NodePolicy
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.sharing.plan import build_plan
from gpuslice.state import PlanState

MPS_2 = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""


def inventory_of(node: str) -> Inventory:
    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


async def test_a_health_change_keeps_the_table_and_a_reload_builds_a_new_one() -> None:
    inventory = inventory_of("sim:2xh100-80gb")
    state = PlanState(build_plan(inventory, parse_config(MPS_2)), inventory)
    first = state.current.policy
    assert {s.strategy for s in first.sharing.values()} == {SharingStrategy.MPS}
    assert state.publish(unhealthy=frozenset({inventory.gpus[0].uuid})).policy is first
    assert state.publish(cordoned=frozenset()).policy is first
    reloaded = state.publish(plan=build_plan(inventory, parse_config("version: v1\n"))).policy
    assert reloaded is not first
    assert reloaded.sharing == {}


def test_the_same_question_gets_the_same_offer_and_a_new_one_a_new_offer() -> None:
    inventory = inventory_of("sim:1xh100-80gb/mig=1g.10gb*2")
    policy = NodePolicy(build_plan(inventory, parse_config("version: v1\n")), inventory)
    count = SharesMode("count", 2)
    offer = policy.offer(count, dynamic=("all",))
    assert policy.offer(count, dynamic=["all"]) is offer
    # the partitions of a dynamic MIG GPU are published, never as shares: they have no UUID
    # until a claim makes them
    assert offer.partitions()
    assert not set(offer.partitions()) & set(offer.offers_by_name())
    static = policy.offer(count)
    assert static is not offer
    assert not static.partitions()
    # without dynamic MIG, NVIDIA's count mode offers every MIG device as shares
    assert len(static.devices) == 2
    assert set(static.offers_by_name()) == {d.name for d in static.devices}
