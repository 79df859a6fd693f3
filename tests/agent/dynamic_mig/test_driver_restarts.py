"""The DRA driver with dynamic MIG across restarts: the real `DraDriver`, the API objects in
memory (`emulator.dra_store`, whose allocator counts shared counters as the scheduler does),
a simulated H100 that keeps its MIG devices across "agent restarts" (a new driver on the
same files), as a GPU does.

- agent restart with the claim prepared: the instance stays, the kubelet's repeated Prepare
  gets the same device and nothing is created;
- the DRA record corrupt: rebuilt from the API and the CDI specs, the instance stays;
- a Prepare that fails after creation (the CDI spec cannot be written): the instance is
  destroyed and the claim prepares on retry;
- Unprepare destroys the instance; a repeated Unprepare is a success."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.agent.dynamic_mig import JOURNAL_NAME, DynamicMig
from gpuslice.backends import open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.sharing.plan import build_plan
from gpuslice.emulator.dra_store import DraStore
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.state import PlanState, Snapshot
from gpuslice.whatif.claims import DEFAULT_DEVICE_CLASSES

DRIVER = "gpu.nvidia.com"
NODE = "n1"
CONFIG = "version: v1\nflags:\n  dynamicMig: {}\n"


class Node:
    def __init__(self, tmp: Path) -> None:
        backend = open_backend("sim:1xh100-80gb/mig=")
        assert isinstance(backend, SimulatedBackend)
        self.backend = backend
        self.tmp = tmp
        self.store = DraStore(NODE, DRIVER)
        for cls in DEFAULT_DEVICE_CLASSES:
            self.store.add_device_class(cls)
        self.cdi_fails = False
        self.record_fails_at: int | None = None
        """The write of the dynamic MIG record (1-based, from the driver's start) that fails."""
        self.config = CONFIG

    def snapshot(self) -> Snapshot:
        inventory = self.backend.inventory()
        return PlanState(build_plan(inventory, parse_config(self.config)), inventory).current

    def driver(self) -> tuple[DraDriver, DynamicMig]:
        """A driver as the agent builds one at its start, on this node's files."""
        node = self

        class Record(CheckpointFile):
            writes = 0

            def write(self, data: bytes) -> None:
                Record.writes += 1
                if Record.writes == node.record_fails_at:
                    raise OSError("No space left on device")
                super().write(data)

        dynamic = DynamicMig(self.backend, Record(self.tmp / JOURNAL_NAME), "boot")

        class Cdi(CdiSpecStore):
            def write(self, claim_uid: str, spec: Mapping[str, Any]) -> Path:
                if node.cdi_fails:
                    raise OSError("No space left on device")
                return super().write(claim_uid, spec)

        driver = DraDriver(
            DriverSettings(DRIVER, NODE, mps_root=str(self.tmp / "mps")),
            objects=self.store,
            checkpoint=CheckpointFile(self.tmp / "checkpoint.json"),
            cdi=Cdi(self.tmp / "cdi", CDI_KIND),
            snapshot=self.snapshot,
            boot_id="boot",
            dynamic_mig=dynamic,
            dynamic=lambda: self.snapshot().plan.dynamic_mig,
        )
        return driver, dynamic

    async def publish(self, dynamic: DynamicMig) -> None:
        publisher = SlicePublisher(
            self.store,
            driver=DRIVER,
            node=NODE,
            snapshot=self.snapshot,
            dynamic=lambda: self.snapshot().plan.dynamic_mig,
            ours=dynamic.ours,
        )
        await publisher.publish_once()

    def claim(self, name: str, profile: str) -> ClaimRef:
        selector = f"device.attributes['{DRIVER}'].profile == '{profile}'"
        request = {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": selector}}],
        }
        made = self.store.add_claim({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": request}]}},
        })  # fmt: skip
        self.store.allocate_claim("ns", name, pod_uid=f"pod-{name}", pod_name=name)
        return ClaimRef("ns", str(made["metadata"]["uid"]), name)

    def migs(self) -> list[str]:
        gpu = self.backend.inventory().gpus[0]
        return [f"{m.profile}@{m.placement_start}" for m in gpu.mig_devices]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def started(node: Node) -> tuple[DraDriver, DynamicMig]:
    driver, dynamic = node.driver()
    await driver.load()
    await node.publish(dynamic)
    return driver, dynamic


async def test_an_agent_restart_keeps_the_prepared_claims_instance(node: Node) -> None:
    first, _ = await started(node)
    ref = node.claim("a", "2g.20gb")
    result = (await first.prepare([ref]))[ref.uid]
    assert result.error == ""
    assert node.migs() == ["2g.20gb@0"]

    again, _ = await started(node)  # the agent restarted; the GPU kept its instance
    assert node.migs() == ["2g.20gb@0"]
    repeated = (await again.prepare([ref]))[ref.uid]  # the kubelet's re-Prepare
    assert repeated.devices == result.devices
    assert [c[0] for c in node.backend.mig_calls] == ["create"]
    assert await again.unprepare([ref]) == {ref.uid: ""}
    assert node.migs() == []
    assert await again.unprepare([ref]) == {ref.uid: ""}


async def test_a_corrupt_dra_record_is_rebuilt_and_the_instance_stays(node: Node) -> None:
    first, _ = await started(node)
    ref = node.claim("a", "3g.40gb")
    assert (await first.prepare([ref]))[ref.uid].error == ""
    (node.tmp / "checkpoint.json").write_bytes(b"\x00garbage")
    again, _ = await started(node)
    assert node.migs() == ["3g.40gb@0"]
    assert ref.uid in again.claims  # rebuilt from the API and the claim's CDI spec
    assert await again.unprepare([ref]) == {ref.uid: ""}
    assert node.migs() == []


async def test_a_dynamic_mig_record_removed_while_a_claim_is_prepared_is_rebuilt(
    node: Node,
) -> None:
    """Removed by hand (or lost to a kill between setting a corrupt one aside and writing
    its rebuild): the prepared claim's instance is known again from the DRA record's uses,
    so its Unprepare destroys it and the whole GPU is offered again."""
    first, _ = await started(node)
    ref = node.claim("a", "3g.40gb")
    assert (await first.prepare([ref]))[ref.uid].error == ""
    (node.tmp / JOURNAL_NAME).unlink()
    again, dynamic = await started(node)
    [mig] = node.backend.inventory().gpus[0].mig_devices
    assert dynamic.ours() == {mig.uuid}
    assert (node.tmp / JOURNAL_NAME).is_file()
    assert await again.unprepare([ref]) == {ref.uid: ""}
    assert node.migs() == []  # its placements and the whole GPU are free again
    assert dynamic.journal.records == ()


async def test_a_corrupt_dynamic_mig_record_is_rebuilt_in_place_before_it_is_set_aside(
    node: Node,
) -> None:
    """The agent killed while it writes the rebuild of a corrupt record: the corrupt one is
    still at the path (and kept aside), so the next start rebuilds again instead of
    finding no record and losing the claim's instance."""
    first, _ = await started(node)
    ref = node.claim("a", "2g.20gb")
    assert (await first.prepare([ref]))[ref.uid].error == ""
    (node.tmp / JOURNAL_NAME).write_bytes(b"\x00garbage")
    node.record_fails_at = 1  # the rebuild's write: the agent dies there
    with pytest.raises(OSError, match="No space left"):
        await started(node)
    assert (node.tmp / JOURNAL_NAME).read_bytes() == b"\x00garbage"
    assert [p.read_bytes() for p in node.tmp.glob(f"{JOURNAL_NAME}.corrupt-*")] == [b"\x00garbage"]
    node.record_fails_at = None
    again, dynamic = await started(node)
    assert len(dynamic.ours()) == 1
    assert await again.unprepare([ref]) == {ref.uid: ""}
    assert node.migs() == []


async def test_a_static_mig_device_a_claim_uses_is_never_rebuilt_as_one_made_here(
    node: Node,
) -> None:
    """Without dynamic MIG on the GPU, a claim's MIG device is an operator's layout: a
    dynamic MIG record rebuilt (corrupt, or missing) must not take it for one gpuslice
    created, or the claim's Unprepare would destroy the operator's instance."""
    node.config = "version: v1\n"
    gpu = node.backend.inventory().gpus[0].uuid
    node.backend.create_mig(gpu, "3g.40gb", 0)  # the operator's static layout
    first, _ = await started(node)
    ref = node.claim("a", "3g.40gb")
    assert (await first.prepare([ref]))[ref.uid].error == ""
    for damage in (b"\x00garbage", None):
        if damage is None:
            (node.tmp / JOURNAL_NAME).unlink()
        else:
            (node.tmp / JOURNAL_NAME).write_bytes(damage)
        _, dynamic = await started(node)
        assert dynamic.ours() == frozenset()
    again, _ = await started(node)
    assert await again.unprepare([ref]) == {ref.uid: ""}
    assert node.migs() == ["3g.40gb@0"], "the operator's instance stays"


async def test_a_prepare_that_fails_after_creation_destroys_it_and_can_be_retried(
    node: Node,
) -> None:
    driver, dynamic = await started(node)
    ref = node.claim("a", "1g.10gb")
    node.cdi_fails = True
    failed = (await driver.prepare([ref]))[ref.uid]
    assert "No space left on device" in failed.error
    assert node.migs() == []
    assert dynamic.journal.records == ()
    node.cdi_fails = False
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    assert node.migs() == ["1g.10gb@0"]
    assert [c[0] for c in node.backend.mig_calls] == ["create", "destroy", "create"]


async def test_a_placement_someone_else_took_is_refused_and_left(node: Node) -> None:
    driver, _ = await started(node)
    ref = node.claim("a", "4g.40gb")  # allocated gpu-0-mig-4g40gb-5-0
    gpu = node.backend.inventory().gpus[0].uuid
    node.backend.create_mig(gpu, "2g.20gb", 2)  # an operator, between allocation and Prepare
    [theirs] = node.backend.inventory().gpus[0].mig_devices
    failed = (await driver.prepare([ref]))[ref.uid]
    # refused naming the instance in the way (its profile, placement and UUID), not by
    # listing every device the node publishes; nothing touched
    assert failed.error == (
        "ResourceClaim ns/a: device gpu-0-mig-4g40gb-5-0: 4g.40gb at memory slices 0..3 of "
        f"GPU 0 ({gpu}) is taken by MIG device 2g.20gb at placement 2:2 (GPU instance "
        f"{theirs.gi_id}, {theirs.uuid}), which gpuslice did not create for a claim; it is "
        "left alone"
    )
    assert node.migs() == ["2g.20gb@2"]


@pytest.mark.parametrize(
    ("fails_at", "created"),
    [(2, False), (3, True)],
    ids=["before-creation", "after-creation"],
)
async def test_a_record_that_cannot_be_written_fails_the_claim_and_leaves_nothing(
    node: Node, fails_at: int, created: bool
) -> None:
    """The record's first write (before creation) failing: nothing is created. Its second
    (the instance exists) failing: the instance is destroyed again. Either way the claim
    fails with the reason and nothing is left on the GPU."""
    driver, dynamic = await started(node)  # write 1: the record as loaded
    ref = node.claim("a", "1g.10gb")
    node.record_fails_at = fails_at
    failed = (await driver.prepare([ref]))[ref.uid]
    assert "No space left on device" in failed.error
    assert node.migs() == []
    assert dynamic.journal.records == ()
    calls = [c[0] for c in node.backend.mig_calls]
    assert calls == (["create", "destroy"] if created else [])


async def test_a_whole_gpu_claim_on_a_dynamic_gpu_is_refused_not_handed_the_bare_gpu(
    node: Node,
) -> None:
    """A claim allocated `gpu-0` (from slices an earlier release published) on a GPU in MIG
    mode: CUDA cannot run on the bare GPU, so Prepare refuses it, saying why, and creates
    nothing (NVIDIA's driver offers no such GPU whole)."""
    driver, _ = await started(node)
    made = node.store.add_claim({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "whole", "namespace": "ns"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    })  # fmt: skip
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    node.store.set_claim_status("ns", "whole", {"allocation": {"devices": {"results": [result]}}})
    ref = ClaimRef("ns", str(made["metadata"]["uid"]), "whole")
    failed = (await driver.prepare([ref]))[ref.uid]
    gpu = node.backend.inventory().gpus[0].uuid
    assert failed.error.startswith(
        f"ResourceClaim ns/whole: device gpu-0: GPU 0 ({gpu}) is in MIG mode for dynamic MIG, "
        "so the whole GPU is not offered"
    )
    assert ref.uid not in driver.claims
    assert node.migs() == []
    assert not list((node.tmp / "cdi").glob("*"))


async def test_a_me_claim_after_an_operators_me_names_the_instance_holding_the_ofa_unit(
    node: Node,
) -> None:
    """An operator's `1g.10gb+me` made between allocation and Prepare holds the GPU's one
    OFA unit: the claim's `+me` placement is free, but Prepare refuses it naming the
    instance that holds what it needs, and creates nothing."""
    driver, _ = await started(node)
    ref = node.claim("a", "1g.10gb+me")  # allocated gpu-0-mig-1g10gb-me-20-0
    gpu = node.backend.inventory().gpus[0].uuid
    node.backend.create_mig(gpu, "1g.10gb+me", 6)
    [theirs] = node.backend.inventory().gpus[0].mig_devices
    failed = (await driver.prepare([ref]))[ref.uid]
    assert failed.error == (
        "ResourceClaim ns/a: device gpu-0-mig-1g10gb-me-20-0: 1g.10gb+me at memory slices "
        f"0..0 of GPU 0 ({gpu}) needs ofa-engines held by MIG device 1g.10gb+me at placement "
        f"6:1 (GPU instance {theirs.gi_id}, {theirs.uuid}), which gpuslice did not create for "
        "a claim; it is left alone"
    )
    assert node.migs() == ["1g.10gb+me@6"]


async def test_an_instance_made_since_the_gpu_was_last_read_is_named_too(node: Node) -> None:
    """The operator's `+me` appears after the agent last read the GPU (its snapshot still
    offers the claim's placement): Prepare, which reads the GPU again before creating,
    names the instance holding the OFA unit instead of passing on the driver's refusal."""
    frozen = node.snapshot()
    node.snapshot = lambda: frozen  # type: ignore[method-assign]  # not re-read since
    driver, _ = await started(node)
    ref = node.claim("a", "1g.10gb+me")  # allocated gpu-0-mig-1g10gb-me-20-0
    gpu = node.backend.inventory().gpus[0].uuid
    node.backend.create_mig(gpu, "1g.10gb+me", 6)
    [theirs] = node.backend.inventory().gpus[0].mig_devices
    failed = (await driver.prepare([ref]))[ref.uid]
    assert failed.error.endswith(
        "device gpu-0-mig-1g10gb-me-20-0: 1g.10gb+me at memory slices 0..0 of GPU 0 "
        f"({gpu}) needs ofa-engines held by MIG device 1g.10gb+me at placement 6:1 (GPU "
        f"instance {theirs.gi_id}, {theirs.uuid}), which gpuslice did not create for this "
        "claim; it is left alone"
    )
    assert node.migs() == ["1g.10gb+me@6"]
