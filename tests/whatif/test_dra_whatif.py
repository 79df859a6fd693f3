"""`describe --claims` as data: the what-if must say what the real scheduler double and the
real driver then do. Each prediction is checked against the driver run in-process on the
same node (DraStore as the API, the publisher's slices, `DraStore.allocate_claim` as the
scheduler, `DraDriver.prepare` writing real CDI specs): a what-if that drifted from the
driver would show users env, devices or errors they will not get."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.core.attribution import entitlement_of
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.plan import build_plan
from gpuslice.emulator.dra_store import DraStore
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.state import PlanState
from gpuslice.whatif.allocator import AllocationError
from gpuslice.whatif.claims import (
    DEFAULT_DEVICE_CLASSES,
    ClaimsFileError,
    WhatIf,
    load_claims,
    load_device_classes,
    node_slices,
    what_if,
)

DRIVER = "gpu.nvidia.com"
NODE = "n1"
FAKE_MPS = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")
SHARED_4 = "version: v1\nsharing:\n  {strategy}:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"  # noqa: E501
MIG_NODE = "sim:1xh100-80gb,1xh100-80gb/mig=1g.10gb*7"


def claim(name: str, *, cls: str = "gpu.nvidia.com", cel: str = "", **extra: Any) -> Json:
    exactly: Json = {"deviceClassName": cls}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    exactly.update(extra.pop("exactly", {}))
    devices: Json = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if "config" in extra:
        devices["config"] = extra.pop("config")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"devices": devices},
    }


def gpu_config(sharing: Json, kind: str = "GpuConfig") -> list[Json]:
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": sharing}
    return [{"opaque": {"driver": DRIVER, "parameters": params}}]


@dataclass
class Node:
    """The agent's DRA pieces on one simulated node, and what the what-if sees of it."""

    store: DraStore
    state: PlanState
    driver: DraDriver
    workdir: Path

    def predict(self, claims: list[Json]) -> WhatIf:
        snap = self.state.current
        return what_if(
            snap.inventory,
            snap.plan,
            claims,
            pool=NODE,
            mps_root=str(self.workdir / "mps"),
        )

    def allocate(self, obj: Json) -> ClaimRef:
        created = self.store.add_claim(obj)
        meta = created["metadata"]
        self.store.allocate_claim(meta["namespace"], meta["name"], pod_uid=f"uid-{meta['name']}")
        return ClaimRef(meta["namespace"], meta["uid"], meta["name"])

    def cdi_edits(self, uid: str, device: str) -> Json:
        path = self.workdir / "cdi" / f"k8s.gpuslice.io-claim_{uid}.yaml"
        spec = yaml.safe_load(path.read_text("utf-8"))
        (entry,) = [d for d in spec["devices"] if d["name"] == f"{uid}-{device}"]
        edits: Json = entry["containerEdits"]
        return edits


@pytest.fixture
async def mps() -> AsyncIterator[MpsDaemonManager]:
    manager = MpsDaemonManager(
        [], ControlProgram.factory(FAKE_MPS), timings=MpsTimings(health_interval_s=0.5)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield manager
    finally:
        stop.set()
        await task


async def make_node(
    workdir: Path,
    node: str,
    config: str = "version: v1\n",
    mps: MpsDaemonManager | None = None,
    warn: Callable[[str, str], Awaitable[None]] | None = None,
) -> Node:
    backend = open_backend(node)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config(config)), inventory)
    store = DraStore(NODE, DRIVER)
    for cls in DEFAULT_DEVICE_CLASSES:
        store.add_device_class(cls)
    await SlicePublisher(
        store, driver=DRIVER, node=NODE, snapshot=lambda: state.current
    ).publish_once()
    driver = DraDriver(
        DriverSettings(DRIVER, NODE, mps_root=str(workdir / "mps")),
        objects=store,
        checkpoint=CheckpointFile(workdir / "checkpoint.json"),
        cdi=CdiSpecStore(workdir / "cdi", CDI_KIND),
        snapshot=lambda: state.current,
        boot_id="boot-1",
        mps=mps,
        warn=warn,
    )
    await driver.load()
    return Node(store, state, driver, workdir)


async def test_the_what_if_allocates_from_what_the_publisher_publishes(sock_dir: Path) -> None:
    """The slices the what-if allocates from are the agent's, device for device."""
    node = await make_node(sock_dir, MIG_NODE, SHARED_4.format(strategy="timeSlicing"))
    snap = node.state.current
    ours = node_slices(snap.inventory, snap.plan, driver=DRIVER, node=NODE)
    published = node.store.slices()
    assert [s["spec"]["devices"] for s in published] == [s["spec"]["devices"] for s in ours]
    assert any("allowMultipleAllocations" in d for d in ours[0]["spec"]["devices"])


async def test_four_shares_fit_and_the_fifth_gets_the_schedulers_own_refusal(
    sock_dir: Path,
) -> None:
    node = await make_node(sock_dir, "sim:1xh100-80gb", SHARED_4.format(strategy="timeSlicing"))
    claims = [claim(f"c{i}") for i in range(5)]
    report = node.predict(claims)

    assert [c.fits for c in report.claims] == [True, True, True, True, False]
    (gpu,) = report.devices
    assert (gpu.shares, gpu.share_memory_mib) == (4, gpu.memory_mib // 4)
    shares = [c.devices[0].share for c in report.claims[:4]]
    assert all(s is not None and (s.shares, s.replicas) == (1, 4) for s in shares)
    assert len({s.share_id for s in shares if s is not None}) == 4
    first = report.claims[0].devices[0]
    assert first.sharing == "time-slicing"
    assert dict(first.env)["GPUSLICE_GPU_FRACTION"] == "0.25"
    assert (first.entitlement, first.entitlement_mib) == ("time-slicing", gpu.memory_mib // 4)

    # the same five claims through the scheduler double: the fifth's error, word for word
    for c in claims[:4]:
        node.allocate(c)
    node.store.add_claim(claims[4])
    with pytest.raises(AllocationError) as refused:
        node.store.allocate_claim("team-a", "c4")
    fifth = report.claims[4]
    assert (fifth.stage, fifth.error) == ("allocate", str(refused.value))
    assert "shares (asks 1, 0 of 4 left)" in fifth.error


CASES: dict[str, tuple[str, str, Json]] = {
    "time-slicing share": (
        "sim:1xh100-80gb",
        SHARED_4.format(strategy="timeSlicing"),
        claim("ts", exactly={"capacity": {"requests": {"memory": "30Gi"}}}),
    ),
    "MPS share": ("sim:1xh100-80gb", SHARED_4.format(strategy="mps"), claim("ms")),
    "MPS share with cores": (
        "sim:1xh100-80gb",
        SHARED_4.format(strategy="mps"),
        claim("mc", exactly={"capacity": {"requests": {"cores": "20", "memory": "10Gi"}}}),
    ),
    "time-slicing share with cores": (
        "sim:1xh100-80gb",
        SHARED_4.format(strategy="timeSlicing"),
        claim("tc", exactly={"capacity": {"requests": {"cores": "20"}}}),
    ),
    "GpuConfig MPS": (
        "sim:2xh100-80gb",
        "version: v1\n",
        claim(
            "mps",
            exactly={"count": 2},
            config=gpu_config(
                {
                    "strategy": "MPS",
                    "mpsConfig": {
                        "defaultActiveThreadPercentage": 30,
                        "defaultPinnedDeviceMemoryLimit": "10Gi",
                        "defaultPerDevicePinnedMemoryLimit": {"1": "5Gi"},
                    },
                }
            ),
        ),
    ),
    "GpuConfig time-slicing": (
        "sim:1xh100-80gb",
        "version: v1\n",
        claim("ts-cfg", config=gpu_config({"strategy": "TimeSlicing"})),
    ),
    "GuardConfig sharedBy": (
        "sim:1xh100-80gb",
        "version: v1\n",
        claim(
            "guarded",
            config=[
                {
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": "resource.gpuslice.io/v1alpha1",
                            "kind": "GuardConfig",
                            "mode": "enforce",
                            "sharedBy": 3,
                        },
                    }
                }
            ],
        ),
    ),
    "MigDeviceConfig MPS": (
        MIG_NODE,
        "version: v1\n",
        claim(
            "mig-mps",
            cls="mig.nvidia.com",
            config=gpu_config(
                {
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi", "multiUser": True},
                },
                kind="MigDeviceConfig",
            ),
        ),
    ),
    "MIG by CEL": (
        MIG_NODE,
        "version: v1\n",
        claim(
            "mig",
            cls="mig.nvidia.com",
            cel="device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_prediction_is_what_the_driver_then_writes(
    case: str, sock_dir: Path, mps: MpsDaemonManager
) -> None:
    """Env and mounts of each device's CDI entry, the device chosen and the guard's
    entitlement: predicted, then done by the real driver."""
    spec, config, obj = CASES[case]
    node = await make_node(sock_dir, spec, config, mps)
    ref = node.allocate(copy.deepcopy(obj))
    result = (await node.driver.prepare([ref]))[ref.uid]
    assert result.error == ""

    asked = dict(copy.deepcopy(obj), metadata={**obj["metadata"], "uid": ref.uid})
    (predicted,) = node.predict([asked]).claims
    assert predicted.fits, predicted.error
    assert [d.device for d in predicted.devices] == [d.device for d in result.devices]

    plan = node.driver.claims_plan()
    assert plan is not None
    (resource,) = plan.resources
    sms = {g.uuid: g.multiprocessors for g in node.state.current.inventory.gpus}
    for d, advertised in zip(predicted.devices, resource.devices, strict=True):
        edits = node.cdi_edits(ref.uid, d.device)
        assert [f"{k}={v}" for k, v in d.env] == edits["env"]
        mounts = [(m["hostPath"], m["containerPath"]) for m in edits.get("mounts", ())]
        assert [(m.host_path, m.container_path) for m in d.mounts] == mounts
        real = entitlement_of(advertised, sms[advertised.physical.gpu_uuid])
        assert (d.entitlement, d.entitlement_mib) == (real.kind, real.memory_bytes // 2**20)
    await node.driver.unprepare([ref])


async def test_an_mps_claim_reads_its_limits_per_device(sock_dir: Path) -> None:
    node = await make_node(sock_dir, "sim:2xh100-80gb")
    _, _, obj = CASES["GpuConfig MPS"]
    (c,) = node.predict([obj]).claims
    first, second = c.devices
    assert (first.sharing, first.mps_thread_percentage) == ("mps", 30)
    assert (first.mps_pinned_limit_mib, second.mps_pinned_limit_mib) == (10240, 5120)
    assert (first.entitlement, first.entitlement_mib, first.sm_fraction) == ("mps", 10240, 0.3)
    assert dict(first.env)["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert first.mounts[0].host_path == second.mounts[0].host_path  # one daemon for both


async def test_a_claims_time_slicing_on_a_share_fits_with_the_drivers_warning(
    sock_dir: Path, mps: MpsDaemonManager
) -> None:
    """NVIDIA's time-slicing manifest on a node sharing by MPS: the what-if says it fits, on
    the node's MPS sharing, and shows the warning Prepare then posts, word for word."""
    warned: list[tuple[str, str]] = []

    async def warn(reason: str, message: str) -> None:
        warned.append((reason, message))

    node = await make_node(sock_dir, "sim:1xh100-80gb", SHARED_4.format(strategy="mps"), mps, warn)
    ts = claim("ts", config=gpu_config({"strategy": "TimeSlicing"}))
    ref = node.allocate(ts)
    (predicted,) = node.predict([dict(ts, metadata={**ts["metadata"], "uid": ref.uid})]).claims
    assert predicted.fits
    assert predicted.devices[0].sharing == "mps"
    (warning,) = predicted.warnings
    assert "the node's mps sharing is kept" in warning
    assert (await node.driver.prepare([ref]))[ref.uid].error == ""
    assert warned == [("ClaimConfigNotApplied", warning)]
    assert await node.driver.unprepare([ref]) == {ref.uid: ""}


async def test_a_claim_the_driver_would_refuse_shows_the_drivers_error(sock_dir: Path) -> None:
    """A MIG device's MPS config with a limit key that names no device of it passes the
    scheduler and fails at Prepare: the what-if says so with the driver's text, and the
    next claim still sees that MIG device as taken."""
    node = await make_node(sock_dir, MIG_NODE)
    bad_key = claim(
        "mps-mig",
        cls="mig.nvidia.com",
        config=gpu_config(
            {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}},
            kind="MigDeviceConfig",
        ),
    )
    after = claim("next", cls="mig.nvidia.com")
    ref = node.allocate(bad_key)
    real = (await node.driver.prepare([ref]))[ref.uid]
    asked = dict(bad_key, metadata={**bad_key["metadata"], "uid": ref.uid})
    refused, taken = node.predict([asked, after]).claims
    assert (refused.stage, refused.error) == ("prepare", real.error)
    assert "key '3' is neither a UUID of the config's devices nor an index below 1" in refused.error
    assert taken.fits
    assert taken.devices[0].device == "gpu-1-mig-1g10gb-19-1"


async def test_mps_on_a_mig_device_is_predicted_with_its_own_daemon(sock_dir: Path) -> None:
    """NVIDIA's driver runs MPS on a MIG device; the what-if shows it as Prepare does it:
    the MIG device's own daemon (pipe mounts), its limit, and multi-user when asked."""
    node = await make_node(sock_dir, MIG_NODE)
    _, _, obj = CASES["MigDeviceConfig MPS"]
    (c,) = node.predict([obj]).claims
    assert c.fits, c.error
    (d,) = c.devices
    assert (d.type, d.sharing, d.mps_pinned_limit_mib) == ("mig", "mps", 4096)
    assert d.sharing_text == (
        "MPS on the MIG device (its own daemon sees only it): 100% of SMs per client, "
        "pinned memory limit 4096 MiB, multi-user daemon (clients of any user ID)"
    )
    assert dict(d.env)["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert dict(d.env)["NVIDIA_VISIBLE_DEVICES"] == d.uuid


def test_claims_files_multi_document_list_and_template() -> None:
    text = """
kind: List
items:
- kind: ResourceClaim
  metadata: {name: a}
  spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}
---
kind: ResourceClaimTemplate
metadata: {name: t, namespace: ml}
spec:
  spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}
"""
    loaded = load_claims(text)
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in loaded] == [
        ("default", "a"),
        ("ml", "t"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [\n", "YAML syntax error at line 2"),
        ("- 1\n", "not an object"),
        ("kind: Pod\nmetadata: {name: p}\n", "kind 'Pod' is not a ResourceClaim"),
        ("kind: ResourceClaim\nspec: {}\n", "metadata.name is missing"),
        ("kind: ResourceClaim\nmetadata: {name: x}\nspec: {}\n", "non-empty list"),
        (
            "kind: ResourceClaim\nmetadata: {name: x}\n"
            "spec: {devices: {requests: [{name: g, exactly: {count: 1}}]}}\n",
            "deviceClassName is missing",
        ),
        ("", "no ResourceClaim"),
    ],
)
def test_malformed_claims_files_name_the_document_and_field(text: str, message: str) -> None:
    with pytest.raises(ClaimsFileError, match=r"^f\.yaml: ") as err:
        load_claims(text, "f.yaml")
    assert message in str(err.value)


def test_device_classes_replace_the_default_ones(sock_dir: Path) -> None:
    """A class selecting nothing: the claim does not fit, with the allocator's reason."""
    classes = load_device_classes(
        "kind: DeviceClass\nmetadata: {name: gpu.nvidia.com}\n"
        "spec: {selectors: [{cel: {expression: \"device.attributes['gpu.nvidia.com']"
        ".productName == 'Tesla T4'\"}}]}\n"
    )
    backend = open_backend("sim:1xh100-80gb")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    plan = build_plan(inventory, parse_config("version: v1\n"))
    (c,) = what_if(inventory, plan, [claim("x")], classes).claims
    assert not c.fits
    assert "no device matches device class 'gpu.nvidia.com'" in c.error


def test_claims_from_kubectl_get_o_json_are_read() -> None:
    text = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "kind": "ResourceClaim",
                    "metadata": {"name": "a", "namespace": "ml"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                            ]
                        }
                    },
                }
            ],
        }
    )
    (loaded,) = load_claims(text)
    assert loaded["metadata"] == {"name": "a", "namespace": "ml"}


async def test_cores_are_the_mps_thread_percentage_and_said_to_be_unenforced_when_time_sliced(
    sock_dir: Path,
) -> None:
    ask = {"capacity": {"requests": {"cores": "20", "memory": "10Gi"}}}
    mps = await make_node(sock_dir, "sim:1xh100-80gb", SHARED_4.format(strategy="mps"))
    (device,) = mps.predict([claim("m", exactly=ask)]).claims[0].devices
    assert device.mps_thread_percentage == 20
    assert "20% of the SMs (cores: the MPS client's active thread percentage)" in (
        device.sharing_text
    )
    workdir = sock_dir / "ts"
    workdir.mkdir()
    ts = await make_node(workdir, "sim:1xh100-80gb", SHARED_4.format(strategy="timeSlicing"))
    (device,) = ts.predict([claim("t", exactly=ask)]).claims[0].devices
    assert "20% of the SMs (cores) reserved for the scheduler only" in device.sharing_text
    assert "not enforced" in device.sharing_text
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in dict(device.env)
