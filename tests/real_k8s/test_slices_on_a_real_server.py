"""ResourceSlices published by the agent's own publisher to a real kube-apiserver (DRA's
gates on): the server accepts them as written (attributes, capacities, MIG devices, shared
GPUs' consumable capacity), and what it stores reads back as what the agent wants, so the
next publish writes nothing (a spelling the server changed would republish forever)."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.sharing.plan import build_plan
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.kubelet.state import PlanState
from gpuslice.testing import envtest

DRIVER = "gpu.nvidia.com"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


@pytest.mark.parametrize(
    ("spec", "config", "expected"),
    [
        ("sim:2xh100-80gb", "version: v1\n", 2),
        ("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2", "version: v1\n", 4),
        ("sim:1xh100-80gb", SHARED, 1),
    ],
)
async def test_the_server_takes_the_slices_and_a_republish_writes_nothing(
    control_plane: envtest.ControlPlane, spec: str, config: str, expected: int
) -> None:
    node = "dra-" + hashlib.sha256((spec + config).encode()).hexdigest()[:10]
    created = control_plane.kubectl(
        "create", "--validate=false", "-f", "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    backend = open_backend(spec, environ={})
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config(config)), inventory)
    client = make_client(control_plane.kubeconfig, trust_env=False)
    try:
        api = DraApi(client, node, DRIVER)
        publisher = SlicePublisher(api, driver=DRIVER, node=node, snapshot=lambda: state.current)
        first = await publisher.publish_once()
        assert first.create, "published"
        stored = await api.list_slices()
        devices = [d for s in stored for d in s["spec"]["devices"]]
        assert len(devices) == expected
        assert all(s["spec"]["nodeName"] == node for s in stored)
        for device in devices:
            assert device["attributes"]["uuid"]["string"].startswith(("GPU-", "MIG-"))
        if config == SHARED:
            [gpu] = devices
            assert gpu["allowMultipleAllocations"] is True
            assert set(gpu["capacity"]) >= {"shares", "memory"}
        again = SlicePublisher(api, driver=DRIVER, node=node, snapshot=lambda: state.current)
        second = await again.publish_once()
        assert (second.create, second.update, second.delete) == ((), (), ())
    finally:
        await client.close()
