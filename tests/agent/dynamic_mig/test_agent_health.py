"""Health, metrics and the guard know the MIG devices dynamic MIG created: the real agent in
DRA mode (the demo's node), an XID scoped to a created GPU instance taints that partition
only, and the prepared claim's plan (attribution, the guard, the exporter) names the MIG
device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuslice.core.dra.health import device_health
from gpuslice.core.jsontypes import Json
from gpuslice.demo.dra_scenario import NAMESPACE, NODE_NAME, _add_and_allocate, _prepare
from gpuslice.demo.dra_scenario import _running_dra_node as running
from gpuslice.demo.dynmig_scene import DYNAMIC_CONFIG, profile_claim
from gpuslice.testing.eventually import eventually
from gpuslice.whatif.claims import DRIVER

XID_CONTAINED_ECC = 94
"""A contained ECC error: NVML scopes it to the GPU instance it hit."""


def device(slices: list[Json], name: str) -> Json:
    return next(d for s in slices for d in s["spec"].get("devices") or () if d["name"] == name)


async def test_an_xid_on_a_created_instance_taints_its_partition_only(tmp_path: Path) -> None:
    async with running("sim:1xh100-80gb/mig=", tmp_path, DYNAMIC_CONFIG) as n:
        ref = _add_and_allocate(n, profile_claim("half", "3g.40gb"), ("notebook-0",))
        await _prepare(n, ref)
        [result] = n.store.claim(NAMESPACE, "half")["status"]["allocation"]["devices"]["results"]
        name = result["device"]
        assert name == "gpu-0-mig-3g40gb-9-0"  # the first placement the scheduler tries
        backend: Any = n.agent.backend
        gpu = backend.inventory().gpus[0]
        [mig] = backend.live_mig_devices(gpu.uuid)
        state = n.agent.state
        assert state is not None
        await eventually(
            lambda: any(m.uuid == mig.uuid for m in state.current.inventory.gpus[0].mig_devices),
            "the agent's inventory to list the created MIG device",
        )
        plan = n.front.driver.claims_plan()
        assert plan is not None
        [resource] = plan.resources
        assert resource.name == f"claim:{NAMESPACE}/half"
        assert [d.physical.uuid for d in resource.devices] == [mig.uuid]

        backend.inject_xid(gpu.uuid, XID_CONTAINED_ECC, gi_id=mig.gi_id, ci_id=mig.ci_id)

        def tainted() -> bool:
            slices = n.store.slices(node=NODE_NAME, driver=DRIVER)
            return bool(device(slices, name).get("taints"))

        await eventually(tainted, "the partition's taint", timeout=15.0)
        slices = n.store.slices(node=NODE_NAME, driver=DRIVER)
        [taint] = device(slices, name)["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            f"{DRIVER}/xid",
            str(XID_CONTAINED_ECC),
            "NoSchedule",
        )
        for other in ("gpu-0-mig-3g40gb-9-4", "gpu-0-mig-1g10gb-19-0"):
            assert "taints" not in device(slices, other), other
        # the kubelet's health stream (pod status) reports every published device, the
        # created one unhealthy
        inventory = state.current.inventory
        reports = {
            r.device: r
            for r in device_health(
                inventory,
                state.current.unhealthy,
                {gpu.uuid: XID_CONTAINED_ECC},
                pool=NODE_NAME,
                devices=n.front.driver.devices(state.current),
            )
        }
        assert len(reports) == 25  # the partitions; the whole GPU is not published
        assert not reports[name].healthy
        assert reports[name].message == f"XID {XID_CONTAINED_ECC} on {gpu.uuid}"
        assert reports["gpu-0-mig-3g40gb-9-4"].healthy
