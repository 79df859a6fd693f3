"""The node's DRA offer is computed once per plan snapshot (`core.policy`), and the slice
publisher, Prepare, the health stream and `describe --claims` all see the same one."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

import gpuslice.core.policy as policy
from gpuslice.agent.dra_front import PlanHealth
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.publish import SharesMode
from gpuslice.core.policy import DeviceSharing, DraOffer
from gpuslice.whatif.claims import offer_slices, what_if
from tests.agent.dra_driver.test_driver_share_modes import DRIVER, GPU_CLASS, NODE, make_node

TIME_SLICED_4 = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c0", "namespace": "team-a"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
}


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[DraOffer]:
    """Every offer the builder makes, in order."""
    made: list[DraOffer] = []
    real = policy.dra_offer

    def counting(
        sharing: Mapping[str, DeviceSharing],
        inventory: Inventory,
        shares: SharesMode,
        dynamic: Collection[str],
        ours: Collection[str],
    ) -> DraOffer:
        made.append(real(sharing, inventory, shares, dynamic, ours))
        return made[-1]

    monkeypatch.setattr(policy, "dra_offer", counting)
    return made


@pytest.mark.parametrize("mode", [SharesMode("count", 2), SharesMode()], ids=str)
async def test_publisher_prepare_health_and_describe_read_one_offer(
    sock_dir: Path, built: list[DraOffer], mode: SharesMode
) -> None:
    node = await make_node(sock_dir, mode, TIME_SLICED_4, sim="sim:2xh100-80gb")
    driver = node.driver()
    await driver.load()
    ref = node.claim("c0")
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    _, reports = PlanHealth(node.state, pool=NODE, devices=driver.devices).current()
    # a health change is a new snapshot of the same plan: the offer is not built again
    node.state.publish(cordoned=frozenset())
    (second,) = (await driver.prepare([node.claim("c1")])).values()
    assert second.error == ""

    (offer,) = built  # the publisher's, Prepare's (twice) and the health stream's
    published = [d for s in node.store.slices() for d in s["spec"].get("devices") or ()]
    expected = offer_slices(offer, driver=DRIVER, node=NODE)
    assert published == [d for s in expected for d in s["spec"]["devices"]]
    assert {r.device for r in reports} == {d.name for d in offer.devices}
    shared = offer.offers_by_name()
    assert set(shared) == {"gpu-0", "gpu-1"}
    uses = [u for c in driver.claims.values() for u in c.uses]
    assert len(uses) == 2
    assert all(u.share_id for u in uses)  # Prepare took each as the share the slices offer
    assert {u.device for u in uses} <= set(shared)

    # describe (its own process, its own snapshot) builds it once, and the same
    snap = node.state.current
    report = what_if(snap.inventory, snap.plan, [CLAIM], [GPU_CLASS], shares=mode)
    assert report.all_fit
    assert len(built) == 2
    assert built[1] == offer
