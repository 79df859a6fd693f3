"""`gpuslice plugin --dra` on a unified-memory GPU (`sim:1xgb10`: a GB10 / DGX Spark, whose
memory NVML does not report): the node publishes its GPU without a memory capacity, as
NVIDIA's driver does, offers the shares its config asks for by count only, and prepares a
share claim with its SM-time fraction and no memory limit."""

from __future__ import annotations

from pathlib import Path

from gpuslice.core.jsontypes import Json
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import claim_obj, request, running_dra_node

TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


def _env(spec: Json) -> dict[str, str]:
    (entry,) = spec["devices"]
    return dict(e.split("=", 1) for e in entry["containerEdits"]["env"])


async def test_a_gb10_is_published_without_memory_and_shared_by_count(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api, node="sim:1xgb10", config=TS4) as node:
        device = node.devices()["gpu-0"]
        assert device["attributes"]["productName"] == {"string": "NVIDIA GB10"}
        assert "memory" not in device["capacity"]
        assert device["capacity"]["shares"]["value"] == "4"
        assert device["allowMultipleAllocations"] is True

        refs = [node.allocate(claim_obj(f"c{n}", [request("gpu")]), f"pod-{n}") for n in (1, 2)]
        results = await node.prepare(*refs)
        for ref in refs:
            assert results[ref.uid].error == "", results[ref.uid].error
            env = _env(node.cdi_spec(ref.uid))
            assert env["GPUSLICE_GPU_FRACTION"] == "0.25"
            assert "GPUSLICE_MEMORY_LIMIT_MIB" not in env
        assert node.log().count("event=gpu-memory-not-reported") == 1
