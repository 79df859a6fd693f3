"""A DRA claim's own guard mode (GuardConfig `mode`): it can only lower the node's.

Policy-level cases first (pure data), then one pass through the guard loop with real child
processes, a fake /proc and Events through the Kubernetes API double, the tenants coming
from a claims plan through attribution and `tenants_from(..., mode_of)` as the agent's
view builds them.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient

from gpuslice.core.attribution import attribute
from gpuslice.core.cgroups import PodUid
from gpuslice.core.devices import Gpu, GpuUuid
from gpuslice.core.guard import (
    ContainerKey,
    GpuMemory,
    GuardParams,
    GuardState,
    Reserve,
    Tenant,
    effective_mode,
    evaluate,
    holder_mode,
    tenants_from,
)
from gpuslice.core.guard.model import GuardMode, claim_mode
from gpuslice.core.guard.policy import Evaluation
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.guard import GuardView, MemoryGuard, ProcessSignaller
from gpuslice.k8s import PodEvents, make_client
from gpuslice.metrics.procfs import cgroup_identities
from gpuslice.ports import ContainerDevices, GpuProcess
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver
from tests.guard.guard_procs import AGENT_POD, in_pod, sleeper

GIB = 1024**3
TOTAL = 48 * GIB
SHARE = 8 * GIB  # six shares of an L40S-sized GPU
NODE = "gpu-node"


def key(pod: str) -> ContainerKey:
    return ContainerKey("ml", pod, "main")


def tenant(pod: str, used_gib: float, mode: GuardMode | None = None) -> Tenant:
    pid = 100 + sum(map(ord, pod))
    return Tenant(
        key(pod), "GPU-0", SharingStrategy.TIME_SLICING, SHARE, int(used_gib * GIB), (pid,), mode
    )


def run(tenants: list[Tenant], node: GuardMode, state: GuardState | None = None) -> Evaluation:
    used = sum(t.used_bytes for t in tenants)
    params = GuardParams(mode=node, reserve=Reserve(bytes=4 * GIB), grace_s=0)
    gpus = [GpuMemory("GPU-0", 0, TOTAL, TOTAL - used)]
    return evaluate(gpus, tenants, state or GuardState(), params, 0.0)


def decided(ev: Evaluation) -> list[tuple[str, str, bool]]:
    return [(d.kind, d.key.pod, d.enforced) for d in ev.decisions]


def test_the_node_mode_is_a_ceiling_a_claim_can_only_lower() -> None:
    assert effective_mode("observe", "enforce") == "observe"
    assert effective_mode("enforce", "observe") == "observe"
    assert effective_mode("enforce", "off") == "off"
    assert effective_mode("off", "enforce") == "off"
    assert effective_mode("enforce", None) == "enforce"
    assert effective_mode("observe", None) == "observe"


def test_a_claim_weakens_the_guard_on_a_shared_gpu_only_where_the_admin_allows_it() -> None:
    shared = functools.partial(claim_mode, shared=True, override="stricter-only")
    assert shared("enforce", "off") is None  # the node's applies
    assert shared("enforce", "observe") is None
    assert shared("observe", "off") is None
    assert shared("enforce", "enforce") == "enforce"
    assert shared("observe", "enforce") == "enforce"  # effective_mode keeps the ceiling
    assert shared("enforce", None) is None
    allowed = functools.partial(claim_mode, shared=True, override="allow")
    assert allowed("enforce", "off") == "off"
    alone = functools.partial(claim_mode, shared=False, override="stricter-only")
    assert alone("enforce", "off") == "off"  # a whole GPU of its own hurts nobody else


def test_a_tenant_is_off_only_when_every_resource_it_holds_is_off() -> None:
    assert holder_mode(["off", "off"]) == "off"
    assert holder_mode(["off", "observe"]) == "observe"
    assert holder_mode(["observe", "enforce"]) == "enforce"
    assert holder_mode(["off", None]) is None  # a resource without a mode: the node's
    assert holder_mode([]) is None


def test_an_off_claim_is_never_reclaimed_nor_reported() -> None:
    """The same leak that is reclaimed without a claim mode is left alone under `off`: no
    over-share notice, no reclaim, no gauge; its memory still counts as used."""
    pods = [tenant("leaker", 40), tenant("b", 6)]
    assert ("reclaim", "leaker", True) in decided(run(pods, "enforce"))
    ev = run([tenant("leaker", 40, "off"), tenant("b", 6)], "enforce")
    assert ev.decisions == ()
    assert ev.over_share == frozenset()
    assert ev.state.stopping == {}


def test_an_observe_claim_is_reported_but_never_stopped_under_an_enforcing_node() -> None:
    ev = run([tenant("leaker", 40, "observe"), tenant("b", 6)], "enforce")
    assert decided(ev) == [("over-share", "leaker", False), ("reclaim", "leaker", False)]
    assert ev.state.stopping == {}
    # Reported once while it stays a would-be victim, as the node's observe mode does.
    again = run([tenant("leaker", 40, "observe"), tenant("b", 6)], "enforce", ev.state)
    assert decided(again) == []


def test_an_observing_claim_does_not_shield_enforced_borrowers() -> None:
    """45 GiB used, 3 GiB free, reserve 4: the observer's overrun is the largest, but it
    frees nothing, so the enforced borrower behind it is stopped to restore the reserve;
    the `off` claim is not even a candidate."""
    pods = [
        tenant("leaker", 20, "observe"),
        tenant("ignored", 14, "off"),
        tenant("borrower", 11, "enforce"),
    ]
    ev = run(pods, "enforce")
    reclaims = [(p, enforced) for kind, p, enforced in decided(ev) if kind == "reclaim"]
    assert reclaims == [("leaker", False), ("borrower", True)]
    assert set(ev.state.stopping) == {key("borrower")}
    assert key("ignored") not in {d.key for d in ev.decisions}


def test_an_enforce_claim_under_an_observing_node_stays_observed() -> None:
    ev = run([tenant("leaker", 40, "enforce"), tenant("b", 6)], "observe")
    assert ("reclaim", "leaker", False) in decided(ev)
    assert all(not d.enforced for d in ev.decisions)
    assert ev.state.stopping == {}


def test_an_off_node_ignores_claim_modes() -> None:
    assert run([tenant("leaker", 30, "enforce")], "off").decisions == ()


# -- once through the loop ---------------------------------------------------------------------

L40S = GpuUuid("GPU-44444444-0000-0000-0000-000000000000")
PHYS = PhysicalDevice.of_gpu(Gpu(0, L40S, "NVIDIA L40S", 49152, 142, (8, 9), "0:4:0.0", 0))
CLAIM_MODES: dict[str, GuardMode] = {"claim:ml/leaker": "observe", "claim:ml/ignored": "off"}
USED_GIB = {"leaker": 20, "ignored": 14, "borrower": 11}


def claims_plan() -> Plan:
    """Three consumable shares of one GPU, 8 GiB each, one claim per pod."""
    resources = []
    for n, pod in enumerate(USED_GIB):
        name = ResourceName(f"claim:ml/{pod}")
        share = AdvertisedDevice(DeviceId(f"node/gpu-0/s{n}"), PHYS, None, 6, None, 8192)
        resources.append(ResourcePlan(name, name, SharingStrategy.TIME_SLICING, False, (share,)))
    return Plan(resources=tuple(resources))


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[AsyncClient]:
    c = make_client(api.kubeconfig(), trust_env=False)
    try:
        yield c
    finally:
        await c.close()


async def test_the_loop_stops_only_the_enforced_claims_pod(
    tmp_path: Path, api: FakeApiServer, client: AsyncClient
) -> None:
    procs = {}
    uids: dict[PodUid, tuple[str, str]] = {}
    for i, pod in enumerate(USED_GIB):
        uid, cid = f"1f3a5c7e-0000-4000-8000-{i:012d}", f"{i}" * 64
        procs[pod] = p = sleeper()
        in_pod(tmp_path, p.pid, uid, cid)
        api.add_pod("ml", pod, uid, NODE, {"main": f"containerd://{cid}"})
        uids[PodUid(uid)] = ("ml", pod)
    plan = claims_plan()
    assignments = [
        ContainerDevices("ml", pod, "main", f"claim:ml/{pod}", (f"node/gpu-0/s{n}",))
        for n, pod in enumerate(USED_GIB)
    ]

    async def read() -> GuardView:
        live = {pod: p for pod, p in procs.items() if p.poll() is None}
        gpu_procs = [GpuProcess(p.pid, L40S, USED_GIB[pod] * GIB) for pod, p in live.items()]
        identities = cgroup_identities((p.pid for p in live.values()), tmp_path)
        att = attribute(assignments, plan, gpu_procs, identities, uids)
        used = sum(USED_GIB[pod] for pod in live) * GIB
        return GuardView(
            (GpuMemory(L40S, 0, TOTAL, TOTAL - used),),
            tenants_from(att, CLAIM_MODES.get),
            identities,
        )

    guard = MemoryGuard(
        read=read,
        params=GuardParams(mode="enforce", reserve=Reserve(bytes=4 * GIB), grace_s=0),
        signaller=ProcessSignaller(tmp_path, own_pod=PodUid(AGENT_POD)),
        post_event=PodEvents(client, NODE).post,
    )
    try:
        await guard.poll()
        assert procs["borrower"].wait(10) == -signal.SIGTERM
        assert procs["leaker"].poll() is None
        assert procs["ignored"].poll() is None
        events = {(e["involvedObject"]["name"], e["reason"]): e for e in api.events("ml")}
        assert set(events) == {
            ("leaker", "GPUMemoryOverShare"),
            ("borrower", "GPUMemoryOverShare"),
            ("borrower", "GPUMemoryReclaimed"),
        }
        leaker_said = [
            e["message"] for e in api.events("ml") if e["involvedObject"]["name"] == "leaker"
        ]
        assert any("would be reclaimed" in m for m in leaker_said), leaker_said
        # The borrower is gone; the observer is not reported again, the off claim never.
        ev = await guard.poll()
        assert ev is not None
        assert ev.decisions == ()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
