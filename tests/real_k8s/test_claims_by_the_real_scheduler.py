"""A claim allocated by the real kube-scheduler from the slices the agent published, then
prepared by the agent's driver reading it from the real API server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.sharing.plan import build_plan
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.kubelet.state import PlanState
from gpuslice.testing import envtest

DRIVER = "gpu.nvidia.com"
NODE = "dra-sched-1"
NAMESPACE = "claims"
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                     "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
        ]
    },
}  # fmt: skip


def create(plane: envtest.ControlPlane, obj: dict[str, Any], *extra: str) -> None:
    done = plane.kubectl("create", "--validate=false", *extra, "-f", "-", stdin=json.dumps(obj))
    assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr


def get(plane: envtest.ControlPlane, *args: str) -> dict[str, Any]:
    done = plane.kubectl("get", *args, "-o", "json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def test_a_claim_the_scheduler_allocated_is_prepared(
    control_plane: envtest.ControlPlane, tmp_path: Path
) -> None:
    if not control_plane.scheduler:
        pytest.skip(f"no kube-scheduler in {envtest.ASSETS_ENV}")
    plane = control_plane
    create(plane, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    status = {"status": {"allocatable": {"pods": "10", "cpu": "8", "memory": "16Gi"},
                         "capacity": {"pods": "10", "cpu": "8", "memory": "16Gi"}}}  # fmt: skip
    patched = plane.kubectl(
        "patch", "node", NODE, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    assert patched.returncode == 0, patched.stderr
    create(plane, GPU_CLASS)
    create(plane, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    create(plane, {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": NAMESPACE}})  # fmt: skip

    backend = open_backend("sim:2xh100-80gb", environ={})
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    client = make_client(plane.kubeconfig, trust_env=False)
    try:
        api = DraApi(client, NODE, DRIVER)
        await SlicePublisher(api, driver=DRIVER, node=NODE, snapshot=lambda: state.current)\
            .publish_once()  # fmt: skip
        create(plane, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        })  # fmt: skip
        create(plane, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p1", "namespace": NAMESPACE},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                "containers": [{"name": "c", "image": "busybox",
                                "resources": {"claims": [{"name": "gpu"}]}}],
            },
        })  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            claim = get(plane, "resourceclaim", "c1", "-n", NAMESPACE)
            if claim.get("status", {}).get("allocation"):
                break
            assert time.monotonic() < deadline, (claim, (plane.workdir / "kube-scheduler.log")
                                                 .read_text(errors="replace")[-3000:])  # fmt: skip
            await asyncio.sleep(0.2)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRIVER, NODE)
        assert get(plane, "pod", "p1", "-n", NAMESPACE)["spec"]["nodeName"] == NODE

        driver = DraDriver(
            DriverSettings(DRIVER, NODE, mps_root=str(tmp_path / "mps")),
            objects=api,
            checkpoint=CheckpointFile(tmp_path / "checkpoint.json"),
            cdi=CdiSpecStore(tmp_path / "cdi", CDI_KIND),
            snapshot=lambda: state.current,
            boot_id="b",
        )
        await driver.load()
        ref = ClaimRef(NAMESPACE, claim["metadata"]["uid"], "c1")
        prepared = (await driver.prepare([ref]))[ref.uid]
        assert prepared.error == ""
        [device] = prepared.devices
        assert device.device == result["device"]
        assert [p.name for p in (tmp_path / "cdi").glob("*.yaml")] == [
            f"k8s.gpuslice.io-claim_{ref.uid}.yaml"
        ]
        assert await driver.unprepare([ref]) == {ref.uid: ""}
        assert not list((tmp_path / "cdi").glob("*.yaml"))
    finally:
        await client.close()
