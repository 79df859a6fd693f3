"""`gpuslice plugin --dra` streams device health to the kubelet (KEP-4680): an XID injected
on the simulated node reaches the kubelet double as an Unhealthy device with the XID in its
message (what ends up in the pod's `allocatedResourcesStatus`), recovery makes it Healthy
again, and SIGTERM with the stream open still ends the daemon with 0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpuslice.backends import open_backend
from gpuslice.core.dra.publish import dra_devices
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import DRIVER, NODE, running_dra_node

MIG_NODE = "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2"


def _status(node_health: Mapping[tuple[str, str], tuple[str, str]], device: str) -> str:
    return node_health.get((NODE, device), ("", ""))[0]


async def test_an_xid_reaches_the_kubelet_as_unhealthy_then_healthy_again(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        kubelet = node.kubelet
        seen = await kubelet.wait_health(DRIVER, lambda h: len(h) == 2, 15)
        assert seen == {(NODE, "gpu-0"): ("Healthy", ""), (NODE, "gpu-1"): ("Healthy", "")}

        node.control.inject_xid(1, 79)
        seen = await kubelet.wait_health(DRIVER, lambda h: _status(h, "gpu-1") == "Unhealthy", 15)
        assert "XID 79" in seen[(NODE, "gpu-1")][1]
        assert seen[(NODE, "gpu-0")] == ("Healthy", "")

        node.control.inject_recovery(1)
        seen = await kubelet.wait_health(DRIVER, lambda h: _status(h, "gpu-1") == "Healthy", 15)
        assert seen[(NODE, "gpu-1")] == ("Healthy", "")
        # the daemon is stopped by the fixture with this stream open: it must exit 0
        assert kubelet.health_streams[DRIVER] == 1
    assert "dra-health-stream-closed" in node.log()


async def test_an_xid_in_one_gpu_instance_marks_only_that_mig_device(
    sock_dir: Path, api: FakeApiServer
) -> None:
    backend = open_backend(MIG_NODE)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    target = dra_devices(inventory)[1]  # the 2g.10gb device
    assert target.mig is not None
    async with running_dra_node(sock_dir, api, node=MIG_NODE) as node:
        kubelet = node.kubelet
        await kubelet.wait_health(DRIVER, lambda h: len(h) == 4, 15)
        node.control.inject_xid(0, 94, gi_id=target.mig.gi_id)
        seen = await kubelet.wait_health(
            DRIVER, lambda h: _status(h, target.name) == "Unhealthy", 15
        )
        assert "XID 94" in seen[(NODE, target.name)][1]
        others = {d for (_, d), (s, _) in seen.items() if s == "Healthy"}
        assert others == {d.name for d in dra_devices(inventory)} - {target.name}


UNWATCHED_NODE = """\
gpus:
- {model: h100-80gb, uuid: GPU-0e5c4d6a-0000-4000-8000-00000000000a}
- {model: h100-80gb, uuid: GPU-0e5c4d6a-0000-4000-8000-00000000000b, healthEvents: unmonitored}
- {model: h100-80gb, uuid: GPU-0e5c4d6a-0000-4000-8000-00000000000c, healthEvents: unsupported}
"""


async def test_a_gpu_whose_health_events_cannot_be_registered_is_tainted_and_unknown(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """As NVIDIA's DRA driver: a GPU whose health events cannot be registered (refused, or
    too old for them) is tainted `gpu.nvidia.com/unmonitored` with effect `None` (still
    allocatable), its health is Unknown rather than Healthy, and the log names it."""
    node_file = sock_dir / "node.yaml"
    node_file.write_text(UNWATCHED_NODE, encoding="utf-8")
    async with running_dra_node(sock_dir, api, node=f"sim:{node_file}") as node:
        unwatched = {"gpu-1": "GPU-0e5c4d6a-0000-4000-8000-00000000000b"}
        unwatched["gpu-2"] = "GPU-0e5c4d6a-0000-4000-8000-00000000000c"

        def tainted() -> bool:
            devices = node.devices()
            return all("taints" in devices[name] for name in unwatched)

        await node.wait(tainted, "gpu-1 and gpu-2 tainted unmonitored")
        devices = node.devices()
        for name in unwatched:
            (taint,) = devices[name]["taints"]
            assert (taint["key"], taint["effect"]) == (f"{DRIVER}/unmonitored", "None")
            assert "value" not in taint
        assert "taints" not in devices["gpu-0"]
        seen = await node.kubelet.wait_health(
            DRIVER, lambda h: all(_status(h, d) == "Unknown" for d in unwatched), 15
        )
        assert seen[(NODE, "gpu-0")] == ("Healthy", "")
        for name, uuid in unwatched.items():
            assert uuid in seen[(NODE, name)][1]
            assert f"event=health-unmonitored gpu={uuid}" in node.log()
        # still watched for what can be seen: a lost GPU is Unhealthy, not Unknown
        node.control.inject_lost(1)
        seen = await node.kubelet.wait_health(
            DRIVER, lambda h: _status(h, "gpu-1") == "Unhealthy", 15
        )
        assert "lost" in seen[(NODE, "gpu-1")][1]
