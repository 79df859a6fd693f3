"""`CONSUMABLE_SHARES` reaches both halves of the running daemon: the publisher offers every
GPU in NVIDIA's mode, and the driver prepares a claim that took no memory (which it would
refuse in `replicas` mode) without memory hints."""

from __future__ import annotations

from pathlib import Path

from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import claim_obj, request, running_dra_node


async def test_the_daemon_offers_and_prepares_in_nvidias_unlimited_mode(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(
        sock_dir, api, node="sim:2xh100-80gb", env={"CONSUMABLE_SHARES": "unlimited"}
    ) as node:
        devices = node.devices()
        assert set(devices) == {"gpu-0", "gpu-1"}
        for device in devices.values():
            assert device["allowMultipleAllocations"] is True
            assert device["capacity"]["memory"]["requestPolicy"]["default"] == "0"
            assert device["capacity"]["cores"]["value"] == "100"
        refs = [node.allocate(claim_obj(f"c{i}", [request("gpu")]), f"pod-{i}") for i in range(3)]
        results = await node.prepare(*refs)
        assert all(r.error == "" for r in results.values()), results
        assert all(r.devices[0].share_id for r in results.values())
        spec = node.cdi_spec(refs[0].uid)
        env = "\n".join(e for d in spec["devices"] for e in d["containerEdits"].get("env", []))
        assert "GPUSLICE_MEMORY_LIMIT_MIB" not in env
        assert await node.unprepare(*refs) == {r.uid: "" for r in refs}
