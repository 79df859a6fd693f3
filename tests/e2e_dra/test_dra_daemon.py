"""`gpuslice plugin --dra` as a process: registration through the plugin watcher, slices,
claims prepared with the right CDI edits for each kind of sharing, unprepare, restarts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dra_node import (
    DRIVER,
    NODE,
    claim_obj,
    opaque,
    request,
    running_dra_node,
)

from gpuslice.testing.apiserver import FakeApiServer


def _env(spec: dict, name: str) -> dict[str, str]:
    device = next(d for d in spec["devices"] if d["name"].endswith(name))
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


async def test_exclusive_claim_is_prepared_and_unprepared(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api) as node:
        devices = node.devices()
        assert list(devices) == ["gpu-0"]
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        results = await node.prepare(ref)
        result = results[ref.uid]
        assert result.error == ""
        (device,) = result.devices
        assert (device.pool, device.device, device.request_names) == (NODE, "gpu-0", ("gpu",))
        assert device.cdi_ids == (f"k8s.gpuslice.io/claim={ref.uid}-gpu-0",)
        spec = node.cdi_spec(ref.uid)
        uuid = devices["gpu-0"]["attributes"]["uuid"]["string"]
        assert _env(spec, "gpu-0")["NVIDIA_VISIBLE_DEVICES"] == uuid
        again = await node.prepare(ref)
        assert again[ref.uid] == result
        assert await node.unprepare(ref) == {ref.uid: ""}
        assert not (node.cdi_root / f"k8s.gpuslice.io-claim_{ref.uid}.yaml").exists()
        assert await node.unprepare(ref) == {ref.uid: ""}
        _ = DRIVER, opaque
