"""The DRA driver in-process: its record across restarts, reboots and corruption, consumable
shares, the overlap guard, and the claims plan the guard and the exporter read. The API is
the in-memory store and the scheduler the allocator; CDI specs and the checkpoint are real
files."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.agent.guard_view import claim_modes
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.claimplan import claim_resource
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.plan import build_plan
from gpuslice.emulator.dra_store import DraStore
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.state import PlanState
from gpuslice.testing.eventually import eventually
from gpuslice.whatif.allocator import AllocationError
from tests.agent.dra_driver.rig import DRIVER, FAKE_MPS, GPU_CLASS, NODE, Rig

SHARED_4 = """\
version: v1
sharing:
  {strategy}:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


async def test_restart_keeps_claims_and_a_reboot_drops_them_with_their_specs(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    first = (await driver.prepare([ref]))[ref.uid]
    assert first.error == ""
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}

    restarted = rig.driver()
    await restarted.load()
    assert restarted.claims.keys() == {ref.uid}
    assert (await restarted.prepare([ref]))[ref.uid] == first

    rig.boot[0] = "boot-2"  # the node rebooted: nothing prepared exists any more
    rebooted = rig.driver()
    await rebooted.load()
    assert rebooted.claims == {}
    assert rig.cdi_files() == set()
    # and the claim prepares again from scratch, same answer
    assert (await rebooted.prepare([ref]))[ref.uid] == first


async def test_a_corrupt_checkpoint_is_moved_aside_reported_and_the_driver_starts(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    (rig.workdir / "checkpoint.json").write_text('{"format": "gpuslice.io/dra-chec', "utf-8")
    driver = rig.driver()
    await driver.load()
    assert driver.loaded
    assert driver.claims == {}
    (reason, message), *_ = rig.warnings
    assert reason == "CheckpointCorrupt"
    [kept] = [p for p in rig.workdir.iterdir() if p.name.startswith("checkpoint.json.corrupt-")]
    assert f"kept as {kept}" in message
    assert kept.read_text("utf-8") == '{"format": "gpuslice.io/dra-chec', "kept, never deleted"
    ref = rig.claim("c1")
    assert (await driver.prepare([ref]))[ref.uid].error == ""


async def test_a_lost_record_is_rebuilt_from_the_api_and_the_cdi_specs(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Claims allocated here whose CDI spec the agent wrote come back prepared, with what
    their Prepare recorded; a spec whose claim is gone from the API is an orphan."""
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    kept_ref, gone_ref = rig.claim("kept"), rig.claim("gone")
    answers = await driver.prepare([kept_ref, gone_ref])
    before = driver.claims[kept_ref.uid]
    rig.store.delete_claim(gone_ref.namespace, gone_ref.name)
    (rig.workdir / "checkpoint.json").write_bytes(b"[" * 200_000)
    again = rig.driver()
    await again.load()
    assert again.claims == {kept_ref.uid: before}
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{kept_ref.uid}.yaml"}
    (reason, message), *_ = rig.warnings
    assert reason == "CheckpointCorrupt"
    assert "nested too deeply" in message
    assert "Rebuilt 1 prepared claim(s)" in message
    # the kubelet asks again: the same answer; then Unprepare undoes it from the rebuilt record
    assert (await again.prepare([kept_ref]))[kept_ref.uid] == answers[kept_ref.uid]
    assert await again.unprepare([kept_ref]) == {kept_ref.uid: ""}
    assert rig.cdi_files() == set()


async def test_with_the_api_unreachable_a_lost_record_removes_nothing(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    (rig.workdir / "checkpoint.json").write_bytes(b"\x00\xff" * 100)

    async def unreachable(uids: object = None) -> list[Json]:
        raise ConnectionError("connection refused")

    rig.store.list_claims = unreachable  # type: ignore[method-assign]
    again = rig.driver()
    await again.load()
    assert again.claims == {}
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}, "a pod's spec is kept"
    (_, message), *_ = rig.warnings
    assert "the API could not be read" in message


async def test_a_checkpoint_from_a_newer_version_with_more_fields_reads(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    first = (await driver.prepare([ref]))[ref.uid]

    def newer(data: Json) -> None:
        data["claims"][ref.uid]["futureField"] = {"x": 1}
        data["somethingNew"] = [1, 2]

    rig.edit_checkpoint(newer)
    upgraded_back = rig.driver()
    await upgraded_back.load()
    assert rig.warnings == []
    assert (await upgraded_back.prepare([ref]))[ref.uid] == first


async def test_a_prepare_cut_short_leaves_nothing_behind(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    # the agent died between PrepareStarted and PrepareCompleted of a second claim
    half = {"namespace": "team-a", "name": "half", "state": "PrepareStarted"}
    half_uid = "0000cafe-0000-4000-8000-000000000001"
    rig.edit_checkpoint(lambda data: data["claims"].__setitem__(half_uid, half))
    (rig.workdir / "cdi" / f"k8s.gpuslice.io-claim_{half_uid}.yaml").write_text("{}", "utf-8")
    again = rig.driver()
    await again.load()
    assert again.claims.keys() == {ref.uid}
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}


async def test_four_claims_share_a_gpu_the_fifth_finds_no_room(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig("sim:1xh100-80gb", SHARED_4.format(strategy="timeSlicing"))
    (device,) = rig.store.slices()[0]["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["shares"]["value"] == "4"
    driver = rig.driver()
    await driver.load()
    refs = [rig.claim(f"s{i}") for i in range(4)]
    results = await driver.prepare(refs)
    share_ids = {r.devices[0].share_id for r in results.values()}
    assert len(share_ids) == 4
    assert None not in share_ids
    with pytest.raises(AllocationError):
        rig.claim("s4")
    env = _cdi_env(rig, refs[0].uid, "gpu-0")
    memory_mib = int(device["capacity"]["memory"]["value"]) // 2**20
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == str(memory_mib // 4)
    assert env["GPUSLICE_GPU_FRACTION"] == "0.25"
    plan = driver.claims_plan()
    assert plan is not None
    (resource,) = [r for r in plan.resources if r.name == claim_resource("team-a", "s0")]
    (dev,) = resource.devices
    assert dev.entitlement_mib == memory_mib // 4
    assert dev.id == f"{NODE}/gpu-0/{results[refs[0].uid].devices[0].share_id}"
    # shares of one device never trip the overlap guard, an exclusive claim would
    assert (await driver.unprepare(refs[:1])) == {refs[0].uid: ""}
    assert len(driver.claims) == 3


@pytest.fixture
async def mps_manager() -> AsyncIterator[MpsDaemonManager]:
    import asyncio

    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(FAKE_MPS),
        timings=MpsTimings(health_interval_s=0.5, start_poll_s=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield manager
    finally:
        stop.set()
        await task


async def test_mps_shares_run_one_daemon_per_gpu_and_carry_client_limits(
    make_rig: Callable[..., Awaitable[Rig]], mps_manager: MpsDaemonManager
) -> None:
    rig = await make_rig("sim:1xh100-80gb", SHARED_4.format(strategy="mps"))
    rig.mps = mps_manager
    driver = rig.driver()
    await driver.load()
    a, b = rig.claim("a"), rig.claim("b")
    results = await driver.prepare([a, b])
    assert all(r.error == "" for r in results.values()), results
    assert len(mps_manager.specs) == 1  # one daemon serves every share of the GPU
    env = _cdi_env(rig, a.uid, "gpu-0")
    memory_mib = rig.state.current.inventory.gpus[0].memory_mib
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory_mib // 4}M"
    await driver.unprepare([a])
    assert len(mps_manager.specs) == 1  # b still uses it
    await driver.unprepare([b])
    assert mps_manager.specs == ()


async def test_two_shares_unprepared_in_one_call_stop_their_daemon(
    make_rig: Callable[..., Awaitable[Rig]], mps_manager: MpsDaemonManager
) -> None:
    """One kubelet call unpreparing both claims of a GPU's MPS daemon (a pod with two
    claims, or two pods ending together) stops it: each claim's undo used to count the
    other, not yet removed, as still using the daemon, and it ran on with no claim."""
    rig = await make_rig("sim:1xh100-80gb", SHARED_4.format(strategy="mps"))
    rig.mps = mps_manager
    driver = rig.driver()
    await driver.load()
    a, b = rig.claim("a"), rig.claim("b")
    results = await driver.prepare([a, b])
    assert all(r.error == "" for r in results.values()), results
    assert len(mps_manager.specs) == 1
    assert await driver.unprepare([a, b]) == {a.uid: "", b.uid: ""}
    assert mps_manager.specs == ()
    assert driver.claims == {}


class RecordingComputeMode:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def set_mode(self, gpu_uuid: str, mode: str) -> None:
        self.calls.append((gpu_uuid, mode))


async def test_mps_shares_keep_exclusive_process_until_the_last_share_goes(
    make_rig: Callable[..., Awaitable[Rig]], mps_manager: MpsDaemonManager
) -> None:
    """The compute mode is a step of each share claim: the GPU's daemon serves them all,
    so the mode goes back to DEFAULT with the last of them, after its daemon."""
    rig = await make_rig("sim:1xh100-80gb", SHARED_4.format(strategy="mps"))
    rig.mps, rig.compute_mode = mps_manager, RecordingComputeMode()
    driver = rig.driver()
    await driver.load()
    gpu = rig.state.current.inventory.gpus[0].uuid
    a, b = rig.claim("a"), rig.claim("b")
    assert all(r.error == "" for r in (await driver.prepare([a, b])).values())
    assert rig.compute_mode.calls == [(gpu, "EXCLUSIVE_PROCESS")] * 2
    recorded = json.loads((rig.workdir / "checkpoint.json").read_text())["data"]["claims"]
    assert {"strategy": "ComputeMode", "gpus": [gpu], "computeMode": "EXCLUSIVE_PROCESS"} in (
        recorded[a.uid]["applied"]
    )
    await driver.unprepare([a])
    assert rig.compute_mode.calls[-1] == (gpu, "EXCLUSIVE_PROCESS"), "b's daemon still runs"
    await driver.unprepare([b])
    assert mps_manager.specs == ()
    assert rig.compute_mode.calls[-1] == (gpu, "DEFAULT")


async def test_a_claim_recorded_before_the_compute_mode_was_a_step_still_resets_it(
    make_rig: Callable[..., Awaitable[Rig]], mps_manager: MpsDaemonManager
) -> None:
    """An upgrade: the previous release's MPS manager set EXCLUSIVE_PROCESS for the claim's
    daemon and recorded nothing of it; the Unprepare after the upgrade still resets it."""
    rig = await make_rig()
    rig.mps, rig.compute_mode = mps_manager, RecordingComputeMode()
    driver = rig.driver()
    await driver.load()
    mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS"}}  # fmt: skip
    ref = rig.claim("mps", mps)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    [(gpu, _)] = rig.compute_mode.calls

    def as_before(data: Json) -> None:
        claim = data["claims"][ref.uid]
        claim["applied"] = [a for a in claim["applied"] if "computeMode" not in a]

    rig.edit_checkpoint(as_before)
    rig.compute_mode = RecordingComputeMode()
    upgraded = rig.driver()
    await upgraded.load()
    assert await upgraded.unprepare([ref]) == {ref.uid: ""}
    assert rig.compute_mode.calls == [(gpu, "DEFAULT")]


async def test_guard_mode_and_shared_by_come_from_the_claims_guard_config(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    guard = {
        "apiVersion": "resource.gpuslice.io/v1alpha1",
        "kind": "GuardConfig",
        "mode": "observe",
        "sharedBy": 2,
    }
    ref = rig.claim("g", guard)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    assert driver.guard_mode(claim_resource("team-a", "g")) == "observe"
    plan = driver.claims_plan()
    assert plan is not None
    (dev,) = plan.resources[0].devices
    assert (dev.replicas, plan.resources[0].strategy) == (2, "time-slicing")


async def test_a_claims_guard_mode_applies_on_a_shared_gpu_only_where_the_node_allows_it(
    make_rig: Callable[..., Awaitable[Rig]], caplog: pytest.LogCaptureFixture
) -> None:
    """On shares of one GPU, `off` and `observe` claims get the node's `enforce` (told once
    per claim) unless the node says `allow`; a claim alone on a whole GPU keeps its `off`.
    A GPU offered as shares counts as shared with only one claim on it."""
    guard = {"apiVersion": "resource.gpuslice.io/v1alpha1", "kind": "GuardConfig"}
    caplog.set_level(logging.WARNING, logger="gpuslice.guard")
    whole = await make_rig()
    driver = whole.driver()
    await driver.load()
    ref = whole.claim("alone", {**guard, "mode": "off"})
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    assert driver.sharing_claims() == frozenset()
    alone = claim_resource("team-a", "alone")
    assert claim_modes(driver, "enforce", "stricter-only")(alone) == "off"

    shares = await make_rig("sim:1xh100-80gb", SHARED_4.format(strategy="timeSlicing"))
    shares.workdir = shares.workdir / "shares"  # a node of its own: its own checkpoint
    shares.workdir.mkdir()
    driver = shares.driver()
    await driver.load()
    asked = {"quiet": "off", "watched": "observe", "plain": None}
    refs = [
        shares.claim(name, *([{**guard, "mode": mode}] if mode else []))
        for name, mode in asked.items()
    ]
    results = await driver.prepare(refs[:1])
    assert all(r.error == "" for r in results.values()), results
    quiet = claim_resource("team-a", "quiet")
    assert driver.sharing_claims() == {quiet}  # alone on the GPU, but on a share of it
    results = await driver.prepare(refs[1:])
    assert all(r.error == "" for r in results.values()), results
    default = claim_modes(driver, "enforce", "stricter-only")
    allow = claim_modes(driver, "enforce", "allow")
    for _ in range(3):
        assert {n: default(claim_resource("team-a", n)) for n in asked} == dict.fromkeys(asked)
    assert {n: allow(claim_resource("team-a", n)) for n in asked} == asked
    told = [r.getMessage() for r in caplog.records if "guard-claim-mode-ignored" in r.getMessage()]
    assert len(told) == 2, told
    assert any("claim=team-a/quiet" in m and "asked=off" in m for m in told), told


def _cdi_env(rig: Rig, uid: str, device: str) -> dict[str, str]:
    spec = yaml.safe_load((rig.workdir / "cdi" / f"k8s.gpuslice.io-claim_{uid}.yaml").read_text())
    entry = next(d for d in spec["devices"] if d["name"] == f"{uid}-{device}")
    return dict(e.split("=", 1) for e in entry["containerEdits"]["env"])


class RecordingTimeslice:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
        self.calls.append((gpu_uuid, interval))


async def test_time_slicing_without_an_interval_runs_no_nvidia_smi(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig()
    setter = RecordingTimeslice()
    rig.timeslice = setter
    driver = rig.driver()
    await driver.load()
    ts = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }
    ref = rig.claim("ts", ts)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    assert setter.calls == []  # NVIDIA would set interval Default here
    assert await driver.unprepare([ref]) == {ref.uid: ""}
    assert setter.calls == []


async def test_a_claims_time_slicing_on_a_share_runs_on_the_nodes_terms_and_is_told(
    make_rig: Callable[..., Awaitable[Rig]], mps_manager: MpsDaemonManager
) -> None:
    """NVIDIA's time-slicing manifest on a node that offers shares: NVIDIA's driver applies
    the claim's TimeSlicing; gpuslice keeps the node's sharing, prepares the claim and says
    so in a Warning Event. MPS on a share is still refused (NVIDIA refuses it there too)."""
    rig = await make_rig("sim:1xh100-80gb", SHARED_4.format(strategy="mps"))
    rig.mps = mps_manager
    setter = RecordingTimeslice()
    rig.timeslice = setter
    driver = rig.driver()
    await driver.load()
    ts = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    ref = rig.claim("ts", ts)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    assert setter.calls == []  # the GPU is shared by others: no GPU-wide interval
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in _cdi_env(rig, ref.uid, "gpu-0")
    [(reason, message)] = rig.warnings
    assert reason == "ClaimConfigNotApplied"
    assert "ResourceClaim team-a/ts" in message
    assert "TimeSlicing (Long)" in message
    assert "mps sharing is kept" in message
    mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS"}}  # fmt: skip
    refused = rig.claim("mps", mps)
    assert "asks for MPS" in (await driver.prepare([refused]))[refused.uid].error
    assert await driver.unprepare([ref]) == {ref.uid: ""}


def test_dra_mode_without_a_node_name_is_a_usage_error() -> None:
    from click.testing import CliRunner

    from gpuslice.cli.main import main

    result = CliRunner().invoke(main, ["plugin", "--node", "sim:1xt4", "--dra"], env={})
    assert result.exit_code == 2
    assert "--dra needs --node-name" in result.output
    assert "Traceback" not in result.output


class StallingStore(DraStore):
    """An API server that never answers for one claim."""

    async def get_claim(self, namespace: str, name: str) -> Json:
        if name == "stuck":
            import asyncio

            await asyncio.Event().wait()
        return await super().get_claim(namespace, name)


async def test_an_api_that_hangs_fails_its_claim_in_time_and_holds_no_other(
    sock_dir: Path,
) -> None:
    import asyncio

    backend = open_backend("sim:2xh100-80gb")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    store = StallingStore(NODE, DRIVER)
    store.add_device_class(GPU_CLASS)
    rig = Rig(store, state, sock_dir)
    await rig.publish()
    driver = rig.driver(api_timeout_s=2.0)
    await driver.load()
    stuck, fine = rig.claim("stuck"), rig.claim("fine")
    slow = asyncio.create_task(driver.prepare([stuck]))
    await asyncio.sleep(0.05)
    # another pod's claim is prepared while the first one still waits on the API: the
    # fine claim's answer comes first (an order, not a time bound)
    quick = asyncio.create_task(driver.prepare([fine]))
    done, _ = await asyncio.wait({slow, quick}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {quick}
    assert quick.result()[fine.uid].error == ""
    error = (await slow)[stuck.uid].error
    assert "no answer from the API within 2 s" in error


async def test_daemons_outlive_the_agent_and_a_stray_one_is_quit_at_start(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Claims' MPS daemons are left running when the agent stops; at the next start a
    recorded claim's daemon is taken over, and one whose claim the record lost is quit."""
    import asyncio

    from gpuslice.mps.control import process_alive

    rig = await make_rig()
    mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS"}}  # fmt: skip

    def manager() -> MpsDaemonManager:
        return MpsDaemonManager(
            [],
            ControlProgram.factory(FAKE_MPS, quit_grace_s=1.0),
            timings=MpsTimings(health_interval_s=0.5, start_poll_s=0.05),
            keep_running=True,
        )

    def pid_of(ref: ClaimRef) -> int:
        key = next(p for p in (rig.workdir / "mps").iterdir() if p.name.startswith(ref.uid))
        return int((key / "pipe" / "nvidia-cuda-mps-control.pid").read_text())

    first, stop = manager(), asyncio.Event()
    task = asyncio.create_task(first.run(stop))
    rig.mps = first
    driver = rig.driver()
    await driver.load()
    kept, lost = rig.claim("kept", mps), rig.claim("lost", mps)
    assert all(r.error == "" for r in (await driver.prepare([kept, lost])).values())
    kept_pid, lost_pid = pid_of(kept), pid_of(lost)
    stop.set()
    await task
    assert process_alive(kept_pid)
    assert process_alive(lost_pid)
    # the record loses `lost` (as a corrupt file or a cut-short Prepare would)
    rig.edit_checkpoint(lambda data: data["claims"].pop(lost.uid))

    second, stop = manager(), asyncio.Event()
    task = asyncio.create_task(second.run(stop))
    rig.mps = second
    try:
        restarted = rig.driver()
        await restarted.load()
        await eventually(
            lambda: not process_alive(lost_pid), "the lost claim's daemon gone", timeout=5
        )
        await eventually(lambda: second.ready(next(iter(second.readiness()), "")), timeout=5)
        assert pid_of(kept) == kept_pid  # taken over, not restarted
        assert await restarted.unprepare([kept]) == {kept.uid: ""}
        await eventually(
            lambda: not process_alive(kept_pid), "the kept claim's daemon gone", timeout=5
        )
    finally:
        stop.set()
        await task


async def test_an_admin_access_claim_reaches_a_held_device_and_is_no_tenant(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await make_rig("sim:1xh100-80gb")
    driver = rig.driver()
    await driver.load()
    tenant = rig.claim("tenant")
    monitor = rig.store.add_claim(
        {
            "metadata": {"name": "dcgm", "namespace": "monitoring"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "adminAccess": True}}]}},
        }
    )  # fmt: skip
    rig.store.allocate_claim("monitoring", "dcgm", pod_uid="dcgm-pod")
    admin = ClaimRef("monitoring", monitor["metadata"]["uid"], "dcgm")
    allocated = rig.store.claim("monitoring", "dcgm")["status"]["allocation"]["devices"]
    assert allocated["results"][0]["adminAccess"] is True
    results = await driver.prepare([tenant, admin])
    assert results[admin.uid].error == ""  # the overlap guard lets adminAccess through
    assert results[tenant.uid].error == ""
    # a second ordinary claim on the same device is still refused
    rig.store.add_claim(
        {"metadata": {"name": "other", "namespace": "team-a"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
             "deviceClassName": "gpu.nvidia.com"}}]}}}
    )  # fmt: skip
    status = {"allocation": rig.store.claim("team-a", "tenant")["status"]["allocation"]}
    other = rig.store.set_claim_status("team-a", "other", status)
    ref = ClaimRef("team-a", other["metadata"]["uid"], "other")
    assert "already prepared for ResourceClaim team-a/tenant" in (
        (await driver.prepare([ref]))[ref.uid].error
    )
    plan = driver.claims_plan()
    assert plan is not None
    assert [r.name for r in plan.resources] == [claim_resource("team-a", "tenant")]
    restarted = rig.driver()
    await restarted.load()
    assert restarted.claims[admin.uid].uses[0].admin  # kept in the record


async def test_an_mps_daemon_that_never_answers_fails_the_claim_and_is_not_kept(
    sock_dir: Path, make_rig: Callable[..., Awaitable[Rig]]
) -> None:
    import asyncio

    rig = await make_rig()
    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(("false",), timeout_s=1.0),
        timings=MpsTimings(start_timeout_s=0.3, retry_interval_s=0.2, start_poll_s=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        rig.mps = manager
        driver = rig.driver(mps_ready_timeout_s=0.5)
        await driver.load()
        mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS"}}  # fmt: skip
        ref = rig.claim("m", mps)
        error = (await driver.prepare([ref]))[ref.uid].error
        assert "did not answer within 0.5 s" in error
        assert manager.specs == ()  # not left restarting for a claim that failed
        assert driver.claims == {}
        assert rig.cdi_files() == set()
    finally:
        stop.set()
        await task


async def test_an_mps_root_too_long_for_the_control_socket_fails_the_claim_saying_so(
    sock_dir: Path, make_rig: Callable[..., Awaitable[Rig]]
) -> None:
    """A pipe directory whose `control` socket path passes 107 bytes: the daemon could never
    listen (the control program only exits 1, as on the real node of
    tests/real_node/test_nvidia_quickstart_manifests.py under a temporary kubelet root), so
    the claim fails at once naming the path, and no daemon is started or kept."""
    import asyncio

    rig = await make_rig()
    manager = MpsDaemonManager(
        [],
        ControlProgram.factory(("false",), timeout_s=1.0),
        timings=MpsTimings(start_timeout_s=0.3, retry_interval_s=0.2, start_poll_s=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    long_root = sock_dir / ("p" * 60) / "mps"
    try:
        rig.mps = manager
        driver = rig.driver(mps_root=long_root, mps_ready_timeout_s=0.5)
        await driver.load()
        mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS"}}  # fmt: skip
        ref = rig.claim("m", mps)
        error = (await driver.prepare([ref]))[ref.uid].error
        assert f"MPS control socket '{long_root}/{ref.uid}-" in error
        assert "longer than the 107 a unix socket path may have" in error
        assert "--dra-plugin-dir" in error
        assert manager.specs == ()
        assert driver.claims == {}
        assert rig.cdi_files() == set()
    finally:
        stop.set()
        await task


async def test_a_prepare_cut_short_by_a_crash_has_its_interval_reset_at_start(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """`PrepareStarted` is recorded with the planned steps before any runs: what a crash
    leaves in the record says what may have taken effect, and the next start undoes it."""
    rig = await make_rig()
    seen: list[Json] = []

    class Crashing(RecordingTimeslice):
        async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
            await super().set_timeslice(gpu_uuid, interval)
            if interval:  # the agent dies right after setting it: keep the record as it is
                seen.append(json.loads((rig.workdir / "checkpoint.json").read_text()))

    rig.timeslice = Crashing()
    driver = rig.driver()
    await driver.load()
    ts = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    ref = rig.claim("ts", ts)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    [(gpu, interval)] = rig.timeslice.calls
    assert interval != 0
    [record] = seen
    started = record["data"]["claims"][ref.uid]
    assert started["state"] == "PrepareStarted"
    assert started["applied"][0]["gpus"] == [gpu]
    (rig.workdir / "checkpoint.json").write_text(json.dumps(record))  # the crash

    setter = RecordingTimeslice()
    rig.timeslice = setter
    again = rig.driver()
    await again.load()
    assert again.claims == {}
    assert setter.calls == [(gpu, 0)], "the interval is back to Default"


async def test_unprepare_of_an_unrecorded_claim_removes_what_is_left_under_its_uid(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A record lost while the API was unreachable rebuilds nothing and removes nothing; the
    kubelet's Unprepare of such a claim then cleans its CDI spec up."""
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    (rig.workdir / "checkpoint.json").write_bytes(b"{")

    async def unreachable(uids: object = None) -> list[Json]:
        raise ConnectionError("connection refused")

    rig.store.list_claims = unreachable  # type: ignore[method-assign]
    again = rig.driver()
    await again.load()
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}
    assert await again.unprepare([ref]) == {ref.uid: ""}
    assert rig.cdi_files() == set()


async def _unreachable(uids: object = None) -> list[Json]:
    raise ConnectionError("connection refused")


async def test_a_missing_record_with_cdi_specs_on_the_node_is_rebuilt_not_wiped(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """No file is not "nothing prepared": the record was removed, or the agent was killed
    between moving a corrupt one aside and writing its rebuild. The node's CDI specs say
    claims are prepared; they are rebuilt from the API (asking for those UIDs only)."""
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref, other = rig.claim("c1"), rig.claim("c2")
    assert all(r.error == "" for r in (await driver.prepare([ref])).values())
    before = driver.claims[ref.uid]
    (rig.workdir / "checkpoint.json").unlink()
    asked: list[object] = []
    listed = rig.store.list_claims

    async def recording(uids: Any = None) -> list[Json]:
        asked.append(None if uids is None else set(uids))
        return await listed(uids)

    rig.store.list_claims = recording  # type: ignore[method-assign]
    again = rig.driver()
    await again.load()
    assert again.claims == {ref.uid: before}
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}
    assert asked == [{ref.uid}], "only the claims of the node's CDI specs are kept"
    (reason, message), *_ = rig.warnings
    assert reason == "CheckpointMissing"
    assert "Rebuilt 1 prepared claim(s)" in message
    assert (rig.workdir / "checkpoint.json").is_file()
    assert other.uid not in again.claims
    next_start = rig.driver()
    await next_start.load()
    assert next_start.claims == {ref.uid: before}
    assert await next_start.unprepare([ref]) == {ref.uid: ""}
    assert rig.cdi_files() == set()


async def test_an_upgrade_reads_the_record_an_earlier_build_kept_under_the_old_name(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Builds before the rename wrote `checkpoint.json`: read, even with the API away, and
    left where it is (a rollback finds its own record)."""
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    first = (await driver.prepare([ref]))[ref.uid]
    assert first.error == ""
    old = rig.workdir / rig.old_name
    (rig.workdir / "checkpoint.json").rename(old)
    kept = old.read_bytes()
    rig.store.list_claims = _unreachable  # type: ignore[method-assign]
    upgraded = rig.driver()
    await upgraded.load()
    assert upgraded.claims.keys() == {ref.uid}
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}
    assert rig.warnings == []
    assert (await upgraded.prepare([ref]))[ref.uid] == first
    assert old.read_bytes() == kept
    assert (rig.workdir / "checkpoint.json").is_file()


async def test_nvidias_file_under_the_old_name_is_not_read_and_the_record_is_rebuilt(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """With NVIDIA's driver name the old name is NVIDIA's own checkpoint: never read as
    ours, never moved; the lost record is rebuilt from the API instead."""
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    before = driver.claims[ref.uid]
    (rig.workdir / "checkpoint.json").unlink()
    nvidia = '{"checksum": 1, "v1": {"preparedClaims": {}}}'
    (rig.workdir / rig.old_name).write_text(nvidia, "utf-8")
    again = rig.driver()
    await again.load()
    assert again.claims == {ref.uid: before}
    assert rig.cdi_files() == {f"k8s.gpuslice.io-claim_{ref.uid}.yaml"}
    assert (rig.workdir / rig.old_name).read_text("utf-8") == nvidia
    assert not [p for p in rig.workdir.iterdir() if ".corrupt-" in p.name]


async def test_a_record_rebuilt_without_the_api_is_rebuilt_again_at_the_next_start(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A corrupt record met with the API away: the next start (API still away) still
    removes nothing, claims prepared in between are kept, and the first start with the
    API back rebuilds what was missing and records it complete."""
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("c1")
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    before = driver.claims[ref.uid]
    (rig.workdir / "checkpoint.json").write_bytes(b"{")
    listed = rig.store.list_claims
    rig.store.list_claims = _unreachable  # type: ignore[method-assign]
    first = rig.driver()
    await first.load()
    assert first.claims == {}
    later = rig.claim("c2")  # the API answers reads of one claim again, not yet the list
    assert (await first.prepare([later]))[later.uid].error == ""
    specs = {f"k8s.gpuslice.io-claim_{u}.yaml" for u in (ref.uid, later.uid)}
    assert rig.cdi_files() == specs

    second = rig.driver()
    await second.load()
    assert rig.cdi_files() == specs, "a claim the record lacks is never wiped"
    assert second.claims.keys() == {later.uid}

    rig.store.list_claims = listed  # type: ignore[method-assign]
    third = rig.driver()
    await third.load()
    assert third.claims.keys() == {ref.uid, later.uid}
    assert third.claims[ref.uid] == before
    assert rig.cdi_files() == specs
    assert "incomplete" not in json.loads((rig.workdir / "checkpoint.json").read_text())["data"]
    assert await third.unprepare([ref, later]) == {ref.uid: "", later.uid: ""}
    assert rig.cdi_files() == set()


async def test_after_a_reboot_a_claims_mps_dir_with_an_old_pid_file_goes_at_unprepare(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A pid file from before a reboot names nothing of ours, even when a process now
    runs under that pid: the directory of a claim unprepared after the reboot is removed."""
    import asyncio
    import os
    import signal

    from gpuslice.mps.control import process_alive

    rig = await make_rig()
    mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS"}}  # fmt: skip

    def manager() -> MpsDaemonManager:
        return MpsDaemonManager(
            [],
            ControlProgram.factory(FAKE_MPS, quit_grace_s=1.0),
            timings=MpsTimings(health_interval_s=0.5, start_poll_s=0.05),
            keep_running=True,
        )

    first, stop = manager(), asyncio.Event()
    task = asyncio.create_task(first.run(stop))
    rig.mps = first
    driver = rig.driver()
    await driver.load()
    ref = rig.claim("m", mps)
    assert (await driver.prepare([ref]))[ref.uid].error == ""
    stop.set()
    await task
    [key] = [p for p in (rig.workdir / "mps").iterdir() if p.name.startswith(ref.uid)]
    pid_file = key / "pipe" / "nvidia-cuda-mps-control.pid"
    daemon = int(pid_file.read_text())
    # the reboot: the daemon is gone, its pid file stays, and the pid is someone else's now
    os.kill(daemon, signal.SIGKILL)
    await eventually(lambda: not process_alive(daemon), "the MPS daemon gone", timeout=5)
    pid_file.write_text(f"{os.getpid()}\n")
    os.utime(pid_file, (1_000_000_000, 1_000_000_000))  # long before this boot
    rig.boot[0] = "boot-2"

    second, stop = manager(), asyncio.Event()
    task = asyncio.create_task(second.run(stop))
    rig.mps = second
    try:
        rebooted = rig.driver()
        await rebooted.load()
        assert rebooted.claims == {}
        assert await rebooted.unprepare([ref]) == {ref.uid: ""}
        assert not key.exists()
    finally:
        stop.set()
        await task
