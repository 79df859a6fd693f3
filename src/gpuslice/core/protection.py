"""The protection policy: who holds what of each shared GPU's memory, and the limits they get.

One place decides it, and every mechanism reads it: the caps loop (`agent.caps`) applies
`NodeProtection.limits`, the memory guard watches `guard_tenants`, and what is reported is
read from the same holds. Computed from the plan in force and what the kubelet says each
container holds (PodResources), so it follows claims and pods as they come and go.

**A holder is what the scheduler reserved memory for**, not a container:

* a container holding device-plugin replicas (each replica is its own; replicas on one GPU
  add up), or a DRA claim meant for N pods (GuardConfig `sharedBy`, memory / N each): the
  container is the holder, as the guard always counted it;
* a DRA share (consumable capacity: the claim's consumed `memory`) is reserved once per
  claim, however many pods use the claim: the claim is the holder and its containers on
  that GPU are its consumers. Three pods on one `memory: 4Gi` claim hold 4 GiB together,
  not 12 (issue 40, item 5).

**Soft and hard.** The soft limit is what the holder reserved, its guarantee (the guard's
share); so the soft limits on a GPU add up to at most its memory. A share that reserved no
memory (NVIDIA's `--consumable-shares unlimited` and count modes, a claim asking for none) is
guaranteed nothing: soft 0, and its hard limit is what nobody on that GPU reserved (item 6);
NVIDIA's driver gives such a claim the whole GPU as soft and hard, which guarantees memory
the others reserved. The hard limit otherwise follows `--memory-caps-policy`: `strict` the
soft limit, `borrow` the whole GPU.

**Per container.** The driver's limits are per cgroup, so a holder's limits are divided
among its consumers (a claim's 4 GiB over two pods: 2 GiB each), and change as consumers
come and go (the caps loop repairs them). The guard holds the claim as one: its consumers'
memory together against its share, and when it is over, the largest consumer is the one
stopped.

**Over the cap is not capped.** A container whose limits the agent confirmed but which holds
more than its hard limit (it allocated before the limit was set, the driver kept what it
held) is not held by the driver: it stays in the guard's view (`guard_tenants`), and with it
the other consumers of its holder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from gpuslice.core.attribution import (
    Assignment,
    Attribution,
    entitlement_of,
    sum_entitlements,
)
from gpuslice.core.caps import (
    CapPolicy,
    GpuCapability,
    MemoryLimits,
    cappable,
    uncapped,
)
from gpuslice.core.guard.model import ContainerKey, GuardMode, Tenant
from gpuslice.core.guard.policy import tenants_from
from gpuslice.core.sharing.model import AdvertisedDevice, Plan, SharingStrategy
from gpuslice.core.units import MIB, whole_mib

Pair = tuple[ContainerKey, str]
"""(container, GPU UUID)."""


@dataclass(frozen=True, slots=True)
class Hold:
    """One holder's part of one GPU's memory, in bytes."""

    holder: str
    """`claim:<namespace>/<name>` for a DRA share (all its consumers together), else the
    container, `namespace/pod/container`."""
    gpu_uuid: str
    kind: SharingStrategy
    soft_bytes: int
    """Guaranteed: what it reserved; the guard's share."""
    hard_bytes: int
    """The most it may hold on the GPU (the caps policy's hard limit; at most the GPU's
    memory, never `core.caps.LIMIT_MAX`)."""
    consumers: tuple[ContainerKey, ...]
    gpu_total_bytes: int
    whole_gpus: bool = True
    """Every device it holds there is the whole GPU's memory (no MIG device): the driver's
    limits apply."""

    def each(self) -> MemoryLimits:
        """The limits of each consumer: the holder's divided among them, rounded down (to
        whole MiB, the toolkit hook's grain: `core.units.whole_mib`), so together they stay
        within the holder's and a hook-capped container reads back what the agent wants."""
        n = max(1, len(self.consumers))
        return MemoryLimits(whole_mib(self.soft_bytes // n), whole_mib(self.hard_bytes // n))


@dataclass(frozen=True, slots=True)
class NodeProtection:
    """Every hold on the node's GPUs, and which hold each container is a consumer of."""

    holds: tuple[Hold, ...]
    by_consumer: Mapping[Pair, Hold]
    """(container, GPU) -> the hold it is a consumer of (the guard asks once per tenant and
    poll)."""

    def hold_of(self, key: ContainerKey, gpu_uuid: str) -> Hold | None:
        return self.by_consumer.get((key, gpu_uuid))

    def limits(self, capabilities: Mapping[str, GpuCapability]) -> dict[Pair, MemoryLimits]:
        """(container, GPU) -> the limits the driver should hold it to, on capable GPUs,
        for the holders that can be capped at all (`core.caps.cappable`, the rule the
        table's `DeviceEntitlement.cappable` reads for Allocate)."""
        out: dict[Pair, MemoryLimits] = {}
        for hold in self.holds:
            capability = capabilities.get(hold.gpu_uuid)
            if capability is None or not capability.capable:
                continue
            if not cappable(hold.kind, hold.whole_gpus, hold.gpu_total_bytes):
                continue
            for key in hold.consumers:
                out[(key, hold.gpu_uuid)] = hold.each()
        return dict(sorted(out.items()))


Mechanism = Literal["caps", "mps-server", "guard", "own-memory", "none"]
"""What holds a holder to its memory: the driver's limits (`caps`), its MPS server's pinned
limit (`mps-server`), the enforcing memory guard (`guard`), nothing to hold (`own-memory`: a
MIG device or a whole GPU, nobody shares it), or nothing (`none`)."""


def mechanism(
    hold: Hold, capability: GpuCapability | None, guard_mode: str
) -> tuple[Mechanism, str]:
    """What would hold `hold` to its limits on its GPU, on the capability alone, and why not
    the driver where it is not. Observing is not holding: the guard counts where
    `core.caps.uncapped` says (the one rule the reports use); the agent reports `caps` only
    once limits were read back (`core.caps.gpu_protection`)."""
    if not hold.kind.shares_memory:
        return "own-memory", ""
    if hold.kind is SharingStrategy.MPS:
        return "mps-server", ""
    if capability is not None and capability.capable and hold.whole_gpus:
        return "caps", ""
    why = capability.reason if capability is not None else "no caps capability known"
    return ("guard" if uncapped(guard_mode) == "guarded" else "none"), why


def node_protection(
    plan: Plan, assignments: Iterable[Assignment], policy: CapPolicy
) -> NodeProtection:
    """The holds of every container PodResources lists as holding devices of `plan`."""
    devices: dict[tuple[str, str], AdvertisedDevice] = {}
    for resource in plan.resources:
        for dev in resource.devices:
            devices[(resource.name, dev.id)] = dev
    unreserved = unreserved_memory(plan)
    held: dict[Pair, dict[tuple[str, str], AdvertisedDevice]] = {}
    for a in assignments:
        key = ContainerKey(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            found = devices.get((a.resource, device_id))
            if found is not None:
                pair = (key, found.physical.gpu_uuid)
                held.setdefault(pair, {})[(a.resource, device_id)] = found
    groups: dict[tuple[str, str, frozenset[tuple[str, str]]], list[ContainerKey]] = {}
    for (key, gpu), mine in sorted(held.items()):
        resources = {r for r, _ in mine}
        if len(resources) == 1 and all(d.entitlement_mib is not None for d in mine.values()):
            # a DRA share: reserved once for the claim, whoever uses it
            holder = next(iter(resources))
            groups.setdefault((holder, gpu, frozenset(mine)), []).append(key)
        else:
            groups.setdefault((str(key), gpu, frozenset(mine)), []).append(key)
    holds = []
    for (holder, gpu, ids), consumers in groups.items():
        devs = [devices[i] for i in sorted(ids)]
        holds.append(_hold(holder, gpu, devs, tuple(consumers), unreserved.get(gpu, 0), policy))
    by_consumer = {(key, h.gpu_uuid): h for h in holds for key in h.consumers}
    return NodeProtection(tuple(holds), by_consumer)


def unreserved_memory(plan: Plan) -> dict[str, int]:
    """GPU UUID -> its memory less what the shares on it reserved (each share once): the
    most a share that reserved nothing may hold there."""
    total: dict[str, int] = {}
    reserved: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    for resource in plan.resources:
        for dev in resource.devices:
            if dev.physical.kind != "gpu":
                continue
            gpu = dev.physical.gpu_uuid
            total[gpu] = dev.physical.memory_mib * MIB
            if dev.entitlement_mib is not None and (resource.name, dev.id) not in seen:
                seen.add((resource.name, dev.id))
                reserved[gpu] = reserved.get(gpu, 0) + dev.entitlement_mib * MIB
    return {gpu: max(0, t - reserved.get(gpu, 0)) for gpu, t in total.items()}


def _hold(
    holder: str,
    gpu: str,
    devs: list[AdvertisedDevice],
    consumers: tuple[ContainerKey, ...],
    unreserved: int,
    policy: CapPolicy,
) -> Hold:
    entitlement = sum_entitlements([entitlement_of(d, None) for d in devs])
    kind = entitlement.kind
    whole = all(d.physical.kind == "gpu" for d in devs)
    total = devs[0].physical.memory_mib * MIB if whole else 0
    soft = entitlement.memory_bytes
    if total > 0:
        soft = max(0, min(soft, total))
    reserved_nothing = soft == 0 and all(d.entitlement_mib == 0 for d in devs)
    if policy == "borrow" and total > 0:
        hard = total
    elif reserved_nothing:
        hard = unreserved
    else:
        hard = soft
    return Hold(holder, gpu, kind, soft, hard, consumers, total, whole)


def usage_assignments(attribution: Attribution) -> list[_Held]:
    """What each attributed container holds, in the shape PodResources gives it: the
    guard's view of holds comes from the same snapshot as its usage."""
    return [
        _Held(u.namespace, u.pod, u.container, resource, u.device_ids)
        for u in attribution.usages
        for resource in u.resources
    ]


@dataclass(frozen=True, slots=True)
class _Held:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def guard_tenants(
    attribution: Attribution,
    plan: Plan,
    *,
    mode_of: Callable[[str], GuardMode | None] | None = None,
    confirmed: Mapping[Pair, MemoryLimits] | None = None,
) -> tuple[Tenant, ...]:
    """The guard's tenants: each container's usage, with its holder and the holder's share.

    `confirmed` are the limits the caps loop read back, with the memory each cgroup used:
    a capped container within its hard limit is the driver's to hold and leaves the guard's
    view; one above it (by NVML's process list or the read-back) stays, and so do the other
    consumers of its holder, whose memory counts against the same share."""
    # the guard's share is the soft limit, which the caps policy does not change
    protection = node_protection(plan, usage_assignments(attribution), "strict")
    tenants = []
    for t in tenants_from(attribution, mode_of):
        hold = protection.hold_of(t.key, t.gpu_uuid)
        if hold is not None:
            holder = None if hold.holder == str(t.key) else hold.holder
            t = replace(t, share_bytes=hold.soft_bytes, holder=holder)
        tenants.append(t)
    return in_guard_view(tenants, confirmed or {})


def in_guard_view(
    tenants: Iterable[Tenant], confirmed: Mapping[Pair, MemoryLimits]
) -> tuple[Tenant, ...]:
    """The tenants the guard still watches: all but those the driver holds, a container
    whose limits were confirmed (`confirmed`, with the memory its cgroup used) and which
    uses no more than its hard limit, by NVML's process list or the read-back. One above
    it keeps its holder in view: every consumer of that claim on that GPU, each with its
    confirmed hard limit (`Tenant.hard_bytes`), which the guard holds them to as well."""
    listed = list(tenants)

    def held_by_driver(t: Tenant) -> bool:
        limits = confirmed.get((t.key, t.gpu_uuid))
        if limits is None:
            return False
        return max(t.used_bytes, limits.used_bytes or 0) <= limits.hard_bytes

    loose = {(t.holder or str(t.key), t.gpu_uuid) for t in listed if not held_by_driver(t)}
    out = []
    for t in listed:
        if (t.holder or str(t.key), t.gpu_uuid) not in loose:
            continue
        limits = confirmed.get((t.key, t.gpu_uuid))
        out.append(t if limits is None else replace(t, hard_bytes=limits.hard_bytes))
    return tuple(out)
