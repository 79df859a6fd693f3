"""The protection policy (`core.protection`): who holds what of a shared GPU, the limits
each container gets, and what the guard holds them to, on a simulated L40S (46068 MiB).

Issue 40: one share claim used by several pods is held to what the scheduler reserved,
together (item 5); a share that reserved no memory is guaranteed none and held to what
nobody reserved (item 6); a capped container above its hard limit stays in the guard's
view (item 2)."""

from __future__ import annotations

from dataclasses import replace

from gpuslice.core.attribution import Attribution, attribute
from gpuslice.core.caps import GpuCapability, MemoryLimits
from gpuslice.core.cgroups import CgroupIdentity, ContainerId, PodUid
from gpuslice.core.devices import Gpu, GpuUuid
from gpuslice.core.dra.caps import claim_limits
from gpuslice.core.dra.prepared import DeviceUse
from gpuslice.core.gpumemory import Allocation, GpuMemoryModel
from gpuslice.core.guard import (
    ContainerKey,
    GpuMemory,
    GuardParams,
    GuardState,
    Reserve,
    Tenant,
    evaluate,
)
from gpuslice.core.guard.policy import Evaluation
from gpuslice.core.protection import (
    guard_tenants,
    in_guard_view,
    mechanism,
    node_protection,
    unreserved_memory,
)
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.core.units import MIB
from gpuslice.guard.enforcement import message
from gpuslice.ports import ContainerDevices, GpuProcess

GPU = "GPU-44444444-0000-0000-0000-000000000000"
TOTAL_MIB = 46068
PHYS = PhysicalDevice.of_gpu(
    Gpu(0, GpuUuid(GPU), "NVIDIA L40S", TOTAL_MIB, 142, (8, 9), "0:4:0.0", 0)
)
CAPABLE = {GPU: GpuCapability(GPU)}


def share_plan(claims: dict[str, int]) -> Plan:
    """One consumable share per claim (`claim:ml/<name>`), of `claims[name]` MiB."""
    resources = []
    for n, (name, mib) in enumerate(claims.items()):
        resource = ResourceName(f"claim:ml/{name}")
        share = AdvertisedDevice(DeviceId(f"node/gpu-0/s{n}"), PHYS, 0, 1, None, mib)
        resources.append(
            ResourcePlan(resource, resource, SharingStrategy.TIME_SLICING, False, (share,))
        )
    return Plan(resources=tuple(resources))


def consumers(plan: Plan, pods: dict[str, str]) -> list[ContainerDevices]:
    """Pod -> the claim whose share its container `main` uses."""
    ids: dict[str, str] = {r.name: r.devices[0].id for r in plan.resources}
    return [
        ContainerDevices("ml", pod, "main", f"claim:ml/{claim}", (ids[f"claim:ml/{claim}"],))
        for pod, claim in pods.items()
    ]


def key(pod: str) -> ContainerKey:
    return ContainerKey("ml", pod, "main")


def attributed(plan: Plan, pods: dict[str, str], used_mib: dict[str, int]) -> Attribution:
    """Each pod's one process, using `used_mib[pod]` on the GPU."""
    uids = {PodUid(f"00000000-0000-4000-8000-{n:012d}"): ("ml", pod) for n, pod in enumerate(pods)}
    by_pod = {pod: uid for uid, (_, pod) in uids.items()}
    procs = [GpuProcess(1000 + n, GPU, used_mib[pod] * MIB) for n, pod in enumerate(pods)]
    identities = {
        1000 + n: CgroupIdentity(by_pod[pod], ContainerId(f"{n}" * 64), None, None)
        for n, pod in enumerate(pods)
    }
    return attribute(consumers(plan, pods), plan, procs, identities, uids)


def enforce(tenants: tuple[Tenant, ...], used_mib: int) -> Evaluation:
    params = GuardParams(mode="enforce", reserve=Reserve(fraction=0.10), grace_s=0)
    free = (TOTAL_MIB - used_mib) * MIB
    return evaluate([GpuMemory(GPU, 0, TOTAL_MIB * MIB, free)], tenants, GuardState(), params, 0)


def reclaimed(ev: Evaluation) -> list[str]:
    return [d.key.pod for d in ev.decisions if d.kind == "reclaim" and d.enforced]


# -- item 5: one share claim, many pods ---------------------------------------------------


def test_pods_sharing_one_share_claim_are_capped_to_its_memory_together() -> None:
    plan = share_plan({"team": 4096, "other": 20480})
    pods = {"a": "team", "b": "team", "c": "team", "solo": "other"}
    protection = node_protection(plan, consumers(plan, pods), "strict")
    limits = protection.limits(CAPABLE)
    each = 4096 * MIB // 3 // MIB * MIB  # in whole MiB, the hook's grain
    assert {p: limits[(key(p), GPU)] for p in "abc"} == dict.fromkeys(
        "abc", MemoryLimits(each, each)
    )
    assert sum(limits[(key(p), GPU)].hard_bytes for p in "abc") <= 4096 * MIB
    assert limits[(key("solo"), GPU)] == MemoryLimits(20480 * MIB, 20480 * MIB)
    [team] = [h for h in protection.holds if h.holder == "claim:ml/team"]
    assert (team.soft_bytes, team.consumers) == (4096 * MIB, (key("a"), key("b"), key("c")))
    alone = node_protection(plan, consumers(plan, {"a": "team"}), "strict").limits(CAPABLE)
    assert alone == {(key("a"), GPU): MemoryLimits(4096 * MIB, 4096 * MIB)}


def test_the_guard_holds_a_claims_pods_together_and_stops_its_largest() -> None:
    """Three pods on one `memory: 4Gi` claim hold 12 GiB: the claim is 8 GiB over what was
    reserved, as one pod holding 12 GiB would be, and with free memory under the reserve
    its largest consumer is stopped (one is enough here)."""
    plan = share_plan({"team": 4096, "other": 20480})
    pods = {"a": "team", "b": "team", "c": "team", "solo": "other"}
    used = {"a": 4000, "b": 4600, "c": 3900, "solo": 20480}
    busy = sum(used.values()) + 10000  # a process outside pods holds the rest
    tenants = guard_tenants(attributed(plan, pods, used), plan)
    assert {t.key.pod: (t.holder, t.share_bytes) for t in tenants} == {
        **dict.fromkeys("abc", ("claim:ml/team", 4096 * MIB)),
        "solo": ("claim:ml/other", 20480 * MIB),
    }
    ev = enforce(tenants, busy)
    assert reclaimed(ev) == ["b"]
    [notice] = [d for d in ev.decisions if d.kind == "reclaim"]
    assert (notice.holder, notice.holder_used_bytes) == ("claim:ml/team", 12500 * MIB)
    said = message(notice, "SIGTERM")
    assert "claim ml/team's pods use 12500 MiB of the claim's 4096 MiB" in said, said
    assert {k.pod for k, _ in ev.over_share} == {"a", "b", "c"}
    # the same claim's pods within its 4 GiB together: nobody is over, whatever each uses
    within = {"a": 3000, "b": 500, "c": 400, "solo": 20480}
    tenants = guard_tenants(attributed(plan, pods, within), plan)
    calm = enforce(tenants, sum(within.values()) + 19000)
    assert calm.over_share == frozenset()
    assert reclaimed(calm) == []


def test_a_claim_brought_back_within_its_share_loses_no_other_pod() -> None:
    """Strict: the claim is over, its largest consumer is stopped, and the others are left
    alone since the claim is within its share without it."""
    plan = share_plan({"team": 4096})
    pods = {"a": "team", "b": "team"}
    used = {"a": 1000, "b": 3500}
    tenants = guard_tenants(attributed(plan, pods, used), plan)
    params = GuardParams(mode="enforce", strict=True, grace_s=0)
    gpus = [GpuMemory(GPU, 0, TOTAL_MIB * MIB, (TOTAL_MIB - 4500) * MIB)]
    ev = evaluate(gpus, tenants, GuardState(), params, 0)
    assert reclaimed(ev) == ["b"]
    # next poll: b is still exiting; a alone is within the claim's share
    again = evaluate(gpus, tenants, ev.state, params, 0.1)
    assert reclaimed(again) == []


# -- item 6: a share that reserved nothing ------------------------------------------------


def test_a_share_that_reserved_nothing_is_guaranteed_nothing() -> None:
    """NVIDIA's unlimited mode: `sized` reserved 20 GiB, `free` nothing. Soft limits sum to
    at most the GPU (20480 + 0); `free` may hold what nobody reserved (25588 MiB), and the
    guard's share for it is the same 0."""
    plan = share_plan({"sized": 20480, "free": 0})
    pods = {"p": "sized", "q": "free"}
    assert unreserved_memory(plan) == {GPU: (TOTAL_MIB - 20480) * MIB}
    limits = node_protection(plan, consumers(plan, pods), "strict").limits(CAPABLE)
    assert limits[(key("p"), GPU)] == MemoryLimits(20480 * MIB, 20480 * MIB)
    assert limits[(key("q"), GPU)] == MemoryLimits(0, (TOTAL_MIB - 20480) * MIB)
    assert sum(lim.soft_bytes for lim in limits.values()) <= TOTAL_MIB * MIB
    borrow = node_protection(plan, consumers(plan, pods), "borrow").limits(CAPABLE)
    assert borrow[(key("q"), GPU)] == MemoryLimits(0, TOTAL_MIB * MIB)
    tenants = guard_tenants(attributed(plan, pods, {"p": 1000, "q": 30000}), plan)
    assert {t.key.pod: t.share_bytes for t in tenants} == {"p": 20480 * MIB, "q": 0}


def test_the_sized_share_allocates_its_memory_beside_one_that_reserved_nothing() -> None:
    """In the simulator's memory model with the limits applied: the share that reserved
    nothing grows as far as it may and fails its own allocation there; the 20 GiB share
    still gets its 20 GiB (with soft = hard = the GPU for `free`, it could not get 1 GiB)."""
    plan = share_plan({"sized": 20480, "free": 0})
    pods = {"p": "sized", "q": "free"}
    limits = node_protection(plan, consumers(plan, pods), "strict").limits(CAPABLE)
    model = GpuMemoryModel(TOTAL_MIB)
    for pod in pods:
        lim = limits[(key(pod), GPU)]
        model.set_limits(pod, lim.soft_bytes // MIB, lim.hard_bytes // MIB)
    assert model.start(1, Allocation(rate_mib_s=10_000), 0.0, group="q") is None
    model.advance(10.0)
    [death] = model.deaths
    assert (death.pid, death.reason) == (1, "hard-limit")
    model.start(3, Allocation(start_mib=10_000, rate_mib_s=10_000), 10.0, group="q")
    assert model.start(2, Allocation(start_mib=20480), 10.0, group="p") is None
    assert model.usage(2) == 20480


def test_a_claims_hook_limits_for_a_share_that_reserved_nothing() -> None:
    """At Prepare, the claim's CDI spec: soft 0 and hard what the other prepared shares left
    (not soft = hard = 0, which would fail its first allocation)."""
    use = DeviceUse("gpu-0", GPU, SharingStrategy.TIME_SLICING, 1, "s1", 0)
    unreserved = {GPU: (TOTAL_MIB - 20480) * MIB}
    got = claim_limits([use], {GPU: PHYS}, CAPABLE, "strict", unreserved)
    assert got == {"gpu-0": MemoryLimits(0, (TOTAL_MIB - 20480) * MIB)}
    assert claim_limits([use], {GPU: PHYS}, CAPABLE, "strict") == {}  # unknown: the agent's


# -- item 2: over the cap is not capped ---------------------------------------------------


def test_a_capped_container_over_its_hard_limit_stays_in_the_guards_view() -> None:
    """Caps confirmed on all three replicas of a time-sliced GPU (11517 MiB each); the one
    NVML reads at 30000 MiB (it allocated before its limit was set) is not held by the
    driver: it stays in view, and the enforcing guard stops it with grace 0."""
    share = TOTAL_MIB * MIB // 4
    devices = tuple(AdvertisedDevice(DeviceId(f"{GPU}::{i}"), PHYS, i, 4) for i in range(4))
    gpu_resource = ResourceName("nvidia.com/gpu")
    plan = Plan(
        (ResourcePlan(gpu_resource, gpu_resource, SharingStrategy.TIME_SLICING, False, devices),)
    )
    pods = {"leaker": 0, "steady": 1, "late": 2}
    used = {"leaker": 30000, "steady": 10000, "late": 6000}
    uids = {PodUid(f"00000000-0000-4000-8000-{n:012d}"): ("ml", pod) for pod, n in pods.items()}
    held = [
        ContainerDevices("ml", pod, "main", gpu_resource, (f"{GPU}::{n}",))
        for pod, n in pods.items()
    ]
    procs = [GpuProcess(1000 + n, GPU, used[pod] * MIB) for pod, n in pods.items()]
    identities = {
        1000 + n: CgroupIdentity(uid, None, None, None)
        for n, uid in zip(pods.values(), uids, strict=True)
    }
    att = attribute(held, plan, procs, identities, uids)
    confirmed = {
        (key(pod), GPU): MemoryLimits(share, share, used_bytes=used[pod] * MIB) for pod in pods
    }
    tenants = guard_tenants(att, plan, confirmed=confirmed)
    assert [t.key.pod for t in tenants] == ["leaker"]
    assert reclaimed(enforce(tenants, sum(used.values()))) == ["leaker"]
    # the read-back alone (NVML's process list lagging) keeps it in view too
    lagging = {**confirmed, (key("leaker"), GPU): MemoryLimits(share, share, 30000 * MIB)}
    att_low = attribute(
        held, plan, [GpuProcess(1000, GPU, 100 * MIB), *procs[1:]], identities, uids
    )
    assert [t.key.pod for t in guard_tenants(att_low, plan, confirmed=lagging)] == ["leaker"]
    within = {k: MemoryLimits(share, share, 0) for k in confirmed}
    assert (
        guard_tenants(attribute(held, plan, procs[1:], identities, uids), plan, confirmed=within)
        == ()
    )


def test_memory_above_a_confirmed_cap_is_reclaimed_whatever_the_free_memory() -> None:
    """Above its hard limit a pod may hold what the driver keeps back for the others' soft
    limits, which NVML's free memory does not show: the guard stops it after the grace
    though the GPU looks half empty. A claim's pods are held to the claim's hard limit
    together: one over its part, the claim within, is left alone."""
    capped = MemoryLimits(11517 * MIB, 11517 * MIB, 20000 * MIB)
    jax = Tenant(key("jax"), GPU, SharingStrategy.TIME_SLICING, 11517 * MIB, 20000 * MIB, (7,))
    [seen] = in_guard_view([jax], {(key("jax"), GPU): capped})
    assert seen.hard_bytes == 11517 * MIB
    ev = enforce((seen,), 20000)  # 26068 MiB free, far above the reserve
    assert [(d.key.pod, d.reason) for d in ev.decisions if d.kind == "reclaim"] == [
        ("jax", "over-cap")
    ]
    part = MemoryLimits(2048 * MIB, 2048 * MIB)
    a = Tenant(
        key("a"),
        GPU,
        SharingStrategy.TIME_SLICING,
        4096 * MIB,
        3000 * MIB,
        (8,),
        holder="claim:ml/t",
    )
    b = Tenant(
        key("b"),
        GPU,
        SharingStrategy.TIME_SLICING,
        4096 * MIB,
        500 * MIB,
        (9,),
        holder="claim:ml/t",
    )
    confirmed = {(key("a"), GPU): part, (key("b"), GPU): part}
    both = in_guard_view([a, b], confirmed)
    assert [t.key.pod for t in both] == ["a", "b"]  # a is over its part: the claim in view
    assert reclaimed(enforce(both, 3500)) == []


def test_what_holds_each_holder() -> None:
    """Per holder, the mechanism that holds it and why not the driver: observing is not
    holding, an MPS share is its server's, a whole GPU needs nothing."""
    plan = share_plan({"team": 4096})
    [hold] = node_protection(plan, consumers(plan, {"a": "team"}), "strict").holds
    old = GpuCapability(GPU, "driver-without-call")
    assert mechanism(hold, CAPABLE[GPU], "observe") == ("caps", "")
    assert mechanism(hold, old, "enforce") == ("guard", old.reason)
    assert mechanism(hold, old, "observe") == ("none", old.reason)
    assert mechanism(replace(hold, kind=SharingStrategy.MPS), old, "off") == ("mps-server", "")
    assert mechanism(replace(hold, kind=SharingStrategy.NONE), old, "off") == ("own-memory", "")
