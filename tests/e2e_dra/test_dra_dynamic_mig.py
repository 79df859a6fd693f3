"""Dynamic MIG through a real `gpuslice plugin --dra` process: `flags.dynamicMig` in its
config file, a simulated H100 in MIG mode with no instance. The daemon publishes the
partitions and the counter set, Prepare creates the allocated MIG device (its record on
disk, its UUID in the CDI spec), an operator's instance made through the simulator's
control directory takes its placements out of the slices, a repeated Prepare creates
nothing, and Unprepare destroys it while the operator's stays. (Restarts are
`tests/agent/dynamic_mig/test_driver_restarts.py`'s: a simulated GPU lives in the daemon's process,
so a restarted daemon would find a fresh one.)"""

from __future__ import annotations

import json
from pathlib import Path

from gpuslice.agent.dynamic_mig import JOURNAL_NAME
from gpuslice.core.jsontypes import Json
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import DraNode, claim_obj, request, running_dra_node

CONFIG = "version: v1\nflags:\n  dynamicMig:\n    devices: all\n"


def devices(node: DraNode) -> dict[str, Json]:
    return {d["name"]: d for s in node.slices() for d in s["spec"].get("devices") or ()}


def counter_sets(node: DraNode) -> list[str]:
    return [c["name"] for s in node.slices() for c in s["spec"].get("sharedCounters") or ()]


def pool_complete(node: DraNode) -> bool:
    """Whether the API holds one whole generation of the pool: the publisher writes it a
    slice at a time (the counter sets last, in a slice of their own), as the scheduler,
    which counts a pool's slices against `resourceSliceCount`, expects."""
    pools = [s["spec"]["pool"] for s in node.slices()]
    return (
        bool(pools)
        and all(p == pools[0] for p in pools)
        and (len(pools) == pools[0]["resourceSliceCount"])
    )


def records(node: DraNode) -> list[Json]:
    path = node.plugin_dir / JOURNAL_NAME
    return list(json.loads(path.read_text())["data"]["records"]) if path.exists() else []


async def test_a_dynamic_gpu_through_the_daemon(sock_dir: Path, api: FakeApiServer) -> None:
    async with running_dra_node(sock_dir, api, node="sim:1xh100-80gb/mig=", config=CONFIG) as node:
        await node.wait(
            lambda: pool_complete(node) and len(devices(node)) == 25,
            "the partitions (not the whole GPU) and their counter set",
        )
        assert "gpu-0" not in devices(node)
        assert counter_sets(node) == ["gpu-0-counter-set"]

        selector = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
        big = request("mig", "mig.nvidia.com", selectors=[{"cel": {"expression": selector}}])
        ref = node.allocate(claim_obj("half", [big]))
        result = (await node.prepare(ref))[ref.uid]
        assert result.error == ""
        [made] = records(node)
        assert (made["device"], made["profile"], made["start"]) == (
            "gpu-0-mig-3g40gb-9-0",
            "3g.40gb",
            0,
        )
        [entry] = node.cdi_spec(ref.uid)["devices"]
        assert f"NVIDIA_VISIBLE_DEVICES={made['created']['uuid']}" in entry["containerEdits"]["env"]

        # an operator's 1g.10gb at memory slice 6: its placements go
        node.control.send({"kind": "create_mig", "gpu": 0, "profile": "1g.10gb", "start": 6})
        await node.wait(
            lambda: "gpu-0-mig-1g10gb-19-6" not in devices(node),
            "the operator's placement taken out",
        )
        assert "gpu-0-mig-3g40gb-9-0" in devices(node)  # ours: the scheduler counts it

        again = (await node.prepare(ref))[ref.uid]  # the kubelet asks again
        assert again == result
        assert [r["created"]["uuid"] for r in records(node)] == [made["created"]["uuid"]]

        assert await node.unprepare(ref) == {ref.uid: ""}
        assert records(node) == []
        assert "gpu-0-mig-1g10gb-19-6" not in devices(node)  # the operator's is still there
        assert "dynamic-mig-destroyed" in node.log()
        assert "dynamic-mig-not-ours" not in node.log()
