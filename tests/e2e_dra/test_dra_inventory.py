"""The node's ResourceSlices follow its inventory live: MIG turned on for a GPU replaces its
whole-GPU device with its MIG devices in a new pool generation, without a restart."""

from __future__ import annotations

from pathlib import Path

from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import running_dra_node


async def test_a_mig_layout_change_is_republished_live(sock_dir: Path, api: FakeApiServer) -> None:
    args = ["--inventory-interval", "0.2"]
    async with running_dra_node(sock_dir, api, node="sim:2xa100-40gb", args=args) as node:
        assert sorted(node.devices()) == ["gpu-0", "gpu-1"]
        generation = node.slices()[0]["spec"]["pool"]["generation"]
        node.control.set_mig(1, enabled=True, layout="1g.5gb*7")

        def migrated() -> bool:
            names = set(node.devices())
            return "gpu-1" not in names and sum("-mig-1g5gb-" in n for n in names) == 7

        await node.wait(migrated, "gpu-1's MIG devices published")
        assert "gpu-0" in node.devices()
        assert node.slices()[0]["spec"]["pool"]["generation"] > generation
        node.control.set_mig(1, enabled=False)
        await node.wait(lambda: sorted(node.devices()) == ["gpu-0", "gpu-1"], "back to whole")
