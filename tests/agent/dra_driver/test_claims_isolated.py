"""Claims are isolated: one claim's slow MPS start holds no other claim, a cancelled
Prepare leaves nothing behind and can be retried, the overlap guard holds for claims still
in flight, and names that would become paths are refused before anything is read or made.

In-process, with the real MPS daemon manager on the fake control program; a claim's MPS
start is held with the fake's hold directory (`GPUSLICE_FAKE_MPS_HOLD_DIR`). Every wait is
on a condition with a bound, never on a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.aio.keyed_locks import KeyedLocks
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.claims import claim_daemon_key
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import dra_devices
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.plan import build_plan
from gpuslice.emulator.dra_store import DraStore
from gpuslice.emulator.fake_mps_control import HOLD_ENV
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.mps.control import process_alive
from gpuslice.state import PlanState
from gpuslice.testing.eventually import eventually
from tests.agent.dra_driver.rig import DRIVER, FAKE_MPS, GPU_CLASS, NODE, Rig

MPS = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS"},
}
WAIT_S = 20.0


class CountingStore(DraStore):
    """The API double, counting which claims were read."""

    def __init__(self) -> None:
        super().__init__(NODE, DRIVER)
        self.reads: list[tuple[str, str]] = []

    async def get_claim(self, namespace: str, name: str) -> Json:
        self.reads.append((namespace, name))
        return await super().get_claim(namespace, name)


@dataclass
class Node:
    rig: Rig
    store: CountingStore
    mps: MpsDaemonManager
    hold_dir: Path

    def driver(self, timeslice: Any = None, **settings: Any) -> DraDriver:
        defaults: dict[str, Any] = {"mps_ready_timeout_s": 30.0, "prepare_timeout_s": 40.0}
        return DraDriver(
            DriverSettings(
                DRIVER, NODE, mps_root=str(self.rig.workdir / "mps"), **{**defaults, **settings}
            ),
            objects=self.store,
            checkpoint=CheckpointFile(self.rig.workdir / "checkpoint.json"),
            cdi=CdiSpecStore(self.rig.workdir / "cdi", CDI_KIND),
            snapshot=lambda: self.rig.state.current,
            boot_id="boot-1",
            mps=self.mps,
            timeslice=timeslice,
        )

    def uuid_of(self, ref: ClaimRef) -> str:
        claim = self.store.claim(ref.namespace, ref.name)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        devices = {d.name: d for d in dra_devices(self.rig.state.current.inventory)}
        return str(devices[result["device"]].uuid)

    def daemon_dir(self, ref: ClaimRef) -> Path:
        return self.rig.workdir / "mps" / claim_daemon_key(ref.uid, [self.uuid_of(ref)])

    def hold(self, ref: ClaimRef) -> Path:
        """Hold the claim's MPS daemon at its start until the returned file is removed."""
        path = self.hold_dir / self.daemon_dir(ref).name
        path.touch()
        return path

    async def daemon_pid(self, ref: ClaimRef) -> int:
        """The pid of the claim's daemon, once it started (held or not)."""
        pid_file = self.daemon_dir(ref) / "pipe" / "nvidia-cuda-mps-control.pid"
        await eventually(pid_file.exists, f"the MPS daemon of {ref.name} started", timeout=WAIT_S)
        return int(pid_file.read_text())

    def checkpoint_claims(self) -> Json:
        doc = json.loads((self.rig.workdir / "checkpoint.json").read_text("utf-8"))
        claims: Json = doc["data"]["claims"]
        return claims


@pytest.fixture
def hold_dir(sock_dir: Path) -> Path:
    path = sock_dir / "hold"
    path.mkdir()
    return path


def release_all(hold_dir: Path) -> None:
    for held in hold_dir.iterdir():
        held.unlink()


@pytest.fixture
async def node(sock_dir: Path, hold_dir: Path) -> AsyncIterator[Node]:
    backend = open_backend("sim:2xh100-80gb")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    store = CountingStore()
    store.add_device_class(GPU_CLASS)
    rig = Rig(store, state, sock_dir)
    await rig.publish()
    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(
            FAKE_MPS, env={**os.environ, HOLD_ENV: str(hold_dir)}, quit_grace_s=1.0
        ),
        timings=MpsTimings(health_interval_s=0.5, start_poll_s=0.05, start_timeout_s=30.0),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield Node(rig, store, manager, hold_dir)
    finally:
        release_all(hold_dir)
        stop.set()
        await task


async def test_a_hung_mps_start_holds_no_other_claim(node: Node) -> None:
    driver = node.driver()
    await driver.load()
    slow, fast = node.rig.claim("slow", MPS), node.rig.claim("fast")
    assert node.uuid_of(slow) != node.uuid_of(fast)
    released = node.hold(slow)
    pending = asyncio.create_task(driver.prepare([slow]))
    await node.daemon_pid(slow)
    # the other pod's claim is prepared while the first one's daemon does not answer
    got = await asyncio.wait_for(driver.prepare([fast]), WAIT_S)
    assert got[fast.uid].error == ""
    assert not pending.done()
    assert node.checkpoint_claims()[slow.uid]["state"] == "PrepareStarted"
    released.unlink()
    assert (await asyncio.wait_for(pending, WAIT_S))[slow.uid].error == ""
    assert {uid: c.state for uid, c in driver.claims.items()} == {
        slow.uid: "PrepareCompleted",
        fast.uid: "PrepareCompleted",
    }


async def test_a_cancelled_prepare_leaves_nothing_and_the_retry_succeeds(node: Node) -> None:
    driver = node.driver()
    await driver.load()
    ref = node.rig.claim("cut", MPS)
    released = node.hold(ref)
    pending = asyncio.create_task(driver.prepare([ref]))
    pid = await node.daemon_pid(ref)
    pending.cancel()  # as gRPC does when the kubelet's deadline passes
    with pytest.raises(asyncio.CancelledError):
        await pending
    # the undo ran to its end before the cancellation came out
    assert not process_alive(pid)
    assert not node.daemon_dir(ref).exists()
    assert node.rig.cdi_files() == set()
    assert node.checkpoint_claims() == {}
    assert driver.claims == {}
    assert node.mps.specs == ()
    released.unlink()
    retried = (await driver.prepare([ref]))[ref.uid]
    assert retried.error == ""
    assert node.daemon_dir(ref).joinpath("pipe").is_dir()
    assert node.checkpoint_claims()[ref.uid]["state"] == "PrepareCompleted"
    assert await driver.unprepare([ref]) == {ref.uid: ""}
    assert not node.daemon_dir(ref).exists()  # Unprepare removes the daemon's directories


async def test_a_claim_over_its_budget_gets_its_own_error_and_is_undone(node: Node) -> None:
    driver = node.driver(prepare_timeout_s=1.0)
    await driver.load()
    ref = node.rig.claim("late", MPS)
    node.hold(ref)
    error = (await asyncio.wait_for(driver.prepare([ref]), WAIT_S))[ref.uid].error
    assert "team-a/late: not prepared within 1 s" in error
    assert not node.daemon_dir(ref).exists()
    assert node.rig.cdi_files() == set()
    assert node.checkpoint_claims() == {}


async def test_a_device_reserved_by_a_claim_in_flight_is_refused_to_another(node: Node) -> None:
    driver = node.driver()
    await driver.load()
    first = node.rig.claim("first", MPS)
    # a second claim allocated the same device (no scheduler would): the guard's case
    node.rig.store.add_claim(
        {"metadata": {"name": "second", "namespace": "team-a"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
             "deviceClassName": "gpu.nvidia.com"}}]}}}
    )  # fmt: skip
    status = {"allocation": node.store.claim("team-a", "first")["status"]["allocation"]}
    created = node.rig.store.set_claim_status("team-a", "second", status)
    second = ClaimRef("team-a", created["metadata"]["uid"], "second")
    released = node.hold(first)
    pending = asyncio.create_task(driver.prepare([first]))
    await node.daemon_pid(first)
    error = (await asyncio.wait_for(driver.prepare([second]), WAIT_S))[second.uid].error
    assert "already prepared for ResourceClaim team-a/first" in error
    released.unlink()
    assert (await asyncio.wait_for(pending, WAIT_S))[first.uid].error == ""
    assert driver.claims.keys() == {first.uid}


async def test_a_repeated_prepare_waits_for_the_one_in_flight(node: Node) -> None:
    driver = node.driver()
    await driver.load()
    ref = node.rig.claim("twice", MPS)
    released = node.hold(ref)
    one = asyncio.create_task(driver.prepare([ref]))
    await node.daemon_pid(ref)
    two = asyncio.create_task(driver.prepare([ref]))
    await eventually(
        lambda: node.store.reads.count(("team-a", "twice")) == 2,
        "both read the claim",
        timeout=WAIT_S,
    )
    assert not two.done()
    released.unlink()
    first, again = await asyncio.wait_for(asyncio.gather(one, two), WAIT_S)
    assert first[ref.uid].error == ""
    assert again == first
    assert len(node.mps.specs) == 1


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        (ClaimRef("team-a", "../../../../etc", "c"), "claim.uid '../../../../etc'"),
        (ClaimRef("team-a", "a/b", "c"), "claim.uid 'a/b'"),
        (ClaimRef("team-a", "..", "c"), "claim.uid '..'"),
        (
            ClaimRef("../kube-system", "0e3c1b52-0d5a-4a8e-9d0e-2f1c3b4a5d6e", "c"),
            "claim.namespace '../kube-system'",
        ),
        (
            ClaimRef("team-a", "0e3c1b52-0d5a-4a8e-9d0e-2f1c3b4a5d6e", "x/../y"),
            "claim.name 'x/../y'",
        ),
    ],
)
async def test_a_name_that_would_become_a_path_is_refused_before_anything_is_done(
    node: Node, ref: ClaimRef, field: str
) -> None:
    driver = node.driver()
    await driver.load()
    before = sorted(p.relative_to(node.rig.workdir) for p in node.rig.workdir.rglob("*"))
    error = (await driver.prepare([ref]))[ref.uid].error
    assert error.startswith(f"refused: {field}")
    assert (await driver.unprepare([ref]))[ref.uid].startswith(f"refused: {field}")
    assert node.store.reads == []  # not even read from the API
    after = sorted(p.relative_to(node.rig.workdir) for p in node.rig.workdir.rglob("*"))
    assert after == before
    assert node.checkpoint_claims() == {}


class GatedTimeslice:
    """nvidia-smi that, for resets, waits until the test lets it go."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.resetting = asyncio.Event()
        self.go = asyncio.Event()

    async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
        if interval == 0:
            self.resetting.set()
            await self.go.wait()
        self.calls.append((gpu_uuid, interval))


async def test_a_cancelled_unprepare_still_finishes(node: Node) -> None:
    smi = GatedTimeslice()
    driver = node.driver(smi)
    await driver.load()
    long = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    ref = node.rig.claim("gone", long)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    pending = asyncio.create_task(driver.unprepare([ref]))
    await asyncio.wait_for(smi.resetting.wait(), WAIT_S)  # mid-way through the undo
    pending.cancel()
    await asyncio.sleep(0)
    smi.go.set()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert smi.calls == [(node.uuid_of(ref), 3), (node.uuid_of(ref), 0)]
    assert driver.claims == {}
    assert node.checkpoint_claims() == {}
    assert node.rig.cdi_files() == set()


def test_step_deadlines_must_be_shorter_than_the_kubelets() -> None:
    with pytest.raises(ValueError, match=r"DriverSettings.mps_ready_timeout_s 60.0 must be"):
        DriverSettings(DRIVER, NODE, mps_root="/x", mps_ready_timeout_s=60.0)
    with pytest.raises(ValueError, match=r"DriverSettings.prepare_timeout_s 0 must be above 0"):
        DriverSettings(DRIVER, NODE, mps_root="/x", prepare_timeout_s=0)


async def test_keyed_locks_serialize_per_key_and_forget_unused_keys() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    gate = asyncio.Event()

    async def holder(name: str, keys: list[str]) -> None:
        async with locks.holding(keys):
            order.append(f"{name}+")
            await gate.wait()
            order.append(f"{name}-")

    a = asyncio.create_task(holder("a", ["gpu-1", "gpu-0"]))
    b = asyncio.create_task(holder("b", ["gpu-0"]))  # shares gpu-0 with a: waits
    c = asyncio.create_task(holder("c", ["gpu-2"]))  # shares nothing: runs
    await eventually(
        lambda: order == ["a+", "c+"] or order == ["c+", "a+"], "a and c hold", timeout=WAIT_S
    )
    assert locks.held("gpu-0")
    gate.set()
    await asyncio.gather(a, b, c)
    assert order.index("b+") > order.index("a-")
    assert len(locks) == 0


async def test_to_the_end_finishes_the_work_then_passes_the_cancellation_on() -> None:
    finished: list[str] = []
    started = asyncio.Event()

    async def undo() -> None:
        started.set()
        for _ in range(3):
            await asyncio.sleep(0)
        finished.append("undo")

    async def caller() -> None:
        await to_the_end(undo())
        finished.append("after")  # never: the cancellation is raised once undo is done

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["undo"]
