"""The driver in-process with NVIDIA's `--consumable-shares` modes and `cores`: the publisher
offers the node's devices as the mode says, the allocator (the scheduler's double) fits
claims by the published capacities, and Prepare writes what each claim consumed into its
CDI spec (MPS client limits from `cores`). The API is the in-memory store; CDI specs and the
checkpoint are real files."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.claims import share_daemon_key
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import REPLICAS, SharesMode
from gpuslice.core.jsontypes import Json
from gpuslice.core.mps import pinned_limit_shown
from gpuslice.core.sharing.plan import build_plan
from gpuslice.emulator.dra_store import DraStore
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.state import PlanState
from gpuslice.testing.eventually import eventually
from gpuslice.whatif.allocator import AllocationError

DRIVER = "gpu.nvidia.com"
NODE = "n1"
FAKE_MPS = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")
GPU_CLASS = {
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ]
    },
}
MPS_4 = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@dataclass
class Node:
    store: DraStore
    state: PlanState
    workdir: Path
    mode: SharesMode
    mps: MpsDaemonManager | None = None

    def driver(self) -> DraDriver:
        async def warn(reason: str, message: str) -> None:
            return None

        return DraDriver(
            DriverSettings(
                DRIVER, NODE, mps_root=str(self.workdir / "mps"), consumable_shares=self.mode
            ),
            objects=self.store,
            checkpoint=CheckpointFile(self.workdir / "checkpoint.json"),
            cdi=CdiSpecStore(self.workdir / "cdi", CDI_KIND),
            snapshot=lambda: self.state.current,
            boot_id="boot-1",
            mps=self.mps,
            warn=warn,
            old_checkpoint=CheckpointFile(self.workdir / "old.json"),
        )

    def claim(self, name: str, **requests: str) -> ClaimRef:
        """Create and allocate a one-GPU claim asking for these capacities."""
        exactly: Json = {"deviceClassName": "gpu.nvidia.com"}
        if requests:
            exactly["capacity"] = {"requests": requests}
        obj = {
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        created = self.store.add_claim(obj)
        self.store.allocate_claim("team-a", name, pod_uid=f"uid-{name}")
        return ClaimRef("team-a", created["metadata"]["uid"], name)

    def env(self, ref: ClaimRef, device: str = "gpu-0") -> dict[str, str]:
        path = self.workdir / "cdi" / f"k8s.gpuslice.io-claim_{ref.uid}.yaml"
        spec = yaml.safe_load(path.read_text())
        entry = next(d for d in spec["devices"] if d["name"] == f"{ref.uid}-{device}")
        return dict(e.split("=", 1) for e in entry["containerEdits"]["env"])


async def make_node(
    workdir: Path, mode: SharesMode, config: str = "version: v1\n", sim: str = "sim:1xh100-80gb"
) -> Node:
    backend = open_backend(sim)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config(config)), inventory)
    store = DraStore(NODE, DRIVER)
    store.add_device_class(GPU_CLASS)
    await SlicePublisher(
        store, driver=DRIVER, node=NODE, snapshot=lambda: state.current, shares=mode
    ).publish_once()
    return Node(store, state, workdir, mode)


@pytest.fixture
async def mps_manager() -> AsyncIterator[MpsDaemonManager]:
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


async def test_unlimited_claims_that_ask_nothing_all_fit_and_get_no_memory_hints(
    sock_dir: Path,
) -> None:
    node = await make_node(sock_dir, SharesMode("unlimited"))
    driver = node.driver()
    await driver.load()
    refs = [node.claim(f"u{i}") for i in range(6)]
    results = await driver.prepare(refs)
    assert all(r.error == "" for r in results.values()), results
    assert len({r.devices[0].share_id for r in results.values()}) == 6
    assert not {"GPUSLICE_MEMORY_LIMIT_MIB", "XLA_PYTHON_CLIENT_MEM_FRACTION"} & set(
        node.env(refs[0])
    )
    # one that asks for memory is held to it
    sized = node.claim("sized", memory="20Gi")
    assert (await driver.prepare([sized]))[sized.uid].error == ""
    assert node.env(sized)["GPUSLICE_MEMORY_LIMIT_MIB"] == "20480"


async def test_memory_mode_a_claim_that_asks_nothing_takes_the_gpu_sized_ones_share_it(
    sock_dir: Path,
) -> None:
    node = await make_node(sock_dir, SharesMode("memory"))
    whole = node.claim("whole")
    with pytest.raises(AllocationError):
        node.claim("second", memory="1Gi")
    driver = node.driver()
    await driver.load()
    assert (await driver.prepare([whole]))[whole.uid].error == ""
    assert node.env(whole)["GPUSLICE_GPU_FRACTION"] == "1"
    await driver.unprepare([whole])
    node.store.delete_claim("team-a", "whole")
    a, b = node.claim("a", memory="40Gi"), node.claim("b", memory="30Gi")
    results = await driver.prepare([a, b])
    assert all(r.error == "" for r in results.values()), results
    with pytest.raises(AllocationError):
        node.claim("c", memory="40Gi")  # 40 + 30 + 40 > 80


async def test_count_mode_fits_n_claims_each_free_to_use_the_memory(sock_dir: Path) -> None:
    """N shares and no memory by default: such a share reserved no memory, so it is
    guaranteed none (its entitlement is 0, the guard's share and the soft limit alike; its
    hard limit is what no share reserved, `core.protection`), and no hint limits it."""
    node = await make_node(sock_dir, SharesMode("count", 3))
    refs = [node.claim(f"c{i}") for i in range(3)]
    with pytest.raises(AllocationError):
        node.claim("c3")
    driver = node.driver()
    await driver.load()
    results = await driver.prepare(refs)
    assert all(r.error == "" for r in results.values()), results
    plan = driver.claims_plan()
    assert plan is not None
    memory_mib = node.state.current.inventory.gpus[0].memory_mib
    entitlements = {d.entitlement_mib for r in plan.resources for d in r.devices}
    assert entitlements == {0}
    assert memory_mib > 0


async def test_disabled_allocates_each_gpu_whole(sock_dir: Path) -> None:
    node = await make_node(sock_dir, SharesMode("disabled"), MPS_4.replace("mps", "timeSlicing", 1))
    ref = node.claim("only")
    driver = node.driver()
    await driver.load()
    assert (await driver.prepare([ref]))[ref.uid].devices[0].share_id is None
    with pytest.raises(AllocationError):
        node.claim("second")


async def test_cores_under_mps_set_the_claims_thread_percentage_and_are_fitted(
    sock_dir: Path, mps_manager: MpsDaemonManager
) -> None:
    """20 % of the SMs and 10Gi: the claim's clients get an active thread percentage of 20
    and a pinned limit of 10 GiB, and a claim that would take the SMs over 100 % does not
    fit the GPU."""
    node = await make_node(sock_dir, REPLICAS, MPS_4)
    node.mps = mps_manager
    driver = node.driver()
    await driver.load()
    small = node.claim("small", cores="20", memory="10Gi")
    plain = node.claim("plain")
    results = await driver.prepare([small, plain])
    assert all(r.error == "" for r in results.values()), results
    assert node.env(small)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert node.env(small)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert node.env(plain)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"  # 1 of 4 shares
    node.claim("big", cores="80")
    with pytest.raises(AllocationError):
        node.claim("more", cores="1")  # 20 + 80 + 1 > 100
    await driver.unprepare([small, plain])


def test_an_unknown_consumable_shares_value_stops_the_agent_naming_it() -> None:
    from click.testing import CliRunner

    from gpuslice.cli.main import main

    result = CliRunner().invoke(
        main,
        ["plugin", "--node", "sim:1xt4", "--dra", "--node-name", "n1"],
        env={"CONSUMABLE_SHARES": "hafl"},
    )
    assert result.exit_code == 2
    assert "--consumable-shares 'hafl': must be 'replicas'" in result.output
    assert "Traceback" not in result.output


async def _defaults(control: ControlProgram) -> tuple[str, str]:
    return (
        await control.send("get_default_active_thread_percentage"),
        await control.send("get_default_device_pinned_mem_limit 0"),
    )


async def test_the_share_daemon_serves_no_more_than_the_largest_share(
    sock_dir: Path, mps_manager: MpsDaemonManager
) -> None:
    """MPS shares held whatever their env says: the GPU's share daemon runs with defaults
    no larger than the largest share prepared on it (a client that unsets `CUDA_MPS_*` gets
    those, not the whole GPU), raised before a larger share's Prepare returns (its clients'
    env can only lower them) and lowered when it goes, sent to the running daemon, never
    restarted."""
    node = await make_node(sock_dir, REPLICAS, MPS_4)
    node.mps = mps_manager
    driver = node.driver()
    await driver.load()
    gpu = node.state.current.inventory.gpus[0]
    quarter = gpu.memory_mib // 4
    pipe = sock_dir / "mps" / share_daemon_key(gpu.uuid)
    control = ControlProgram(pipe / "pipe", pipe / "log", command=FAKE_MPS)

    small = node.claim("small")
    assert (await driver.prepare([small]))[small.uid].error == ""
    assert await _defaults(control) == ("25.0", pinned_limit_shown(quarter))
    pid = control.daemon_pid()

    large = node.claim("large", memory="40Gi", cores="50")
    assert (await driver.prepare([large]))[large.uid].error == ""
    assert node.env(large)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert await _defaults(control) == ("50.0", "40G")  # the large share's own clients fit

    assert await driver.unprepare([large]) == {large.uid: ""}
    assert await _defaults(control) == ("25.0", pinned_limit_shown(quarter))
    assert control.daemon_pid() == pid  # never restarted: the small share's clients go on
    await driver.unprepare([small])


async def test_a_share_that_reserved_nothing_lifts_the_daemon_only_to_what_nobody_reserved(
    sock_dir: Path, mps_manager: MpsDaemonManager
) -> None:
    """NVIDIA's share modes under MPS (`unlimited`): a share of 20 GiB, then one that
    reserved no memory. The second may hold what no share reserved (its hard limit in
    `core.protection`), so the daemon's pinned default becomes that, not "no limit": a
    client of either share that unsets `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` cannot take the
    20 GiB share's reservation on top (issue 40, items 6 and 7)."""
    node = await make_node(sock_dir, SharesMode("unlimited"), MPS_4)
    node.mps = mps_manager
    driver = node.driver()
    await driver.load()
    gpu = node.state.current.inventory.gpus[0]
    pipe = sock_dir / "mps" / share_daemon_key(gpu.uuid)
    control = ControlProgram(pipe / "pipe", pipe / "log", command=FAKE_MPS)

    sized = node.claim("sized", memory="20Gi")
    assert (await driver.prepare([sized]))[sized.uid].error == ""
    assert (await _defaults(control))[1] == pinned_limit_shown(20480)
    free = node.claim("free")
    assert (await driver.prepare([free]))[free.uid].error == ""
    assert (await _defaults(control))[1] == pinned_limit_shown(gpu.memory_mib - 20480)
    assert await driver.unprepare([free]) == {free.uid: ""}
    assert (await _defaults(control))[1] == pinned_limit_shown(20480)
    await driver.unprepare([sized])


async def test_a_restarted_agent_takes_the_share_daemon_over_with_its_defaults(
    sock_dir: Path,
) -> None:
    """The share daemon outlives the agent (its clients do); the next agent derives its
    defaults again from the recorded claims and takes it over, never restarting it, and
    goes on lowering them as shares leave."""
    node = await make_node(sock_dir, REPLICAS, MPS_4)
    gpu = node.state.current.inventory.gpus[0]
    pipe = sock_dir / "mps" / share_daemon_key(gpu.uuid)
    control = ControlProgram(pipe / "pipe", pipe / "log", command=FAKE_MPS)

    async def agent() -> tuple[MpsDaemonManager, asyncio.Event, asyncio.Task[None]]:
        manager = MpsDaemonManager(
            [],
            ControlProgram.factory(FAKE_MPS),
            timings=MpsTimings(health_interval_s=0.5, start_poll_s=0.05),
            keep_running=True,
        )
        stop = asyncio.Event()
        return manager, stop, asyncio.create_task(manager.run(stop))

    first, stop, task = await agent()
    node.mps = first
    driver = node.driver()
    await driver.load()
    small, large = node.claim("small"), node.claim("large", memory="40Gi", cores="50")
    assert all(r.error == "" for r in (await driver.prepare([small, large])).values())
    pid = control.daemon_pid()
    stop.set()
    await task  # the agent stops; the daemon is left for the next one

    second, stop, task = await agent()
    try:
        node.mps = second
        driver = node.driver()
        await driver.load()
        await eventually(lambda: second.ready(share_daemon_key(gpu.uuid)), "taken over")
        assert control.daemon_pid() == pid
        assert await _defaults(control) == ("50.0", "40G")
        assert await driver.unprepare([large]) == {large.uid: ""}
        assert await _defaults(control) == ("25.0", pinned_limit_shown(gpu.memory_mib // 4))
        assert control.daemon_pid() == pid
        assert await driver.unprepare([small]) == {small.uid: ""}
    finally:
        stop.set()
        await task
