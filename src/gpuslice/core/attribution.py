"""Who is using which GPU, and how much of it each one is entitled to.

Three sources meet here, none of which knows the whole story:

* the kubelet's PodResources `List`: namespace/pod/container -> advertised device IDs
  (replica IDs `<uuid>::<n>` included), but no pod UID and no PIDs;
* NVML: host PIDs with memory (and SM samples, not on MIG) per GPU or MIG device;
* `/proc/<pid>/cgroup`: PID -> pod UID (and container ID), see `core.cgroups`.

The join between a process and a container goes through the pod UID:

1. **UID map** (`pods`, from the API server or the emulator): the process's pod UID gives
   namespace/pod; among that pod's containers holding a device on the process's GPU (or
   MIG device) the one whose container ID matches (`container_names`), or the only one.
2. **Sole holder** (no UID map, or the UID is not in it): when exactly one container holds
   devices on that GPU/MIG device and every pod-process on it comes from one pod UID, all of
   them are that container's. Each such match also teaches UID -> pod, which then attributes
   the same pod's processes on GPUs it shares with others.

Limits of rule 2, by design: on a GPU shared by several containers, a pod seen on no
sole-held GPU stays unattributed (`ambiguous`); a process that reached the GPU without the
plugin (privileged, `NVIDIA_VISIBLE_DEVICES=all`) is blamed on the sole holder unless a
second pod UID on that GPU gives it away. Rule 1 has neither problem: deploy the UID map.

Entitlement per replica, from the plan: exclusive -> the whole GPU; time-slicing -> a fair
share (memory/replicas and 1/replicas of the SMs; nothing enforces it); MPS -> the pinned
memory limit and the active thread percentage (both enforced by the MPS server); MIG ->
the MIG device's memory and SMs. A container holding several devices on one GPU gets the sum.

DRA claims come in the same shape (a *claims plan*: one resource `claim:<ns>/<name>` per
prepared claim, device IDs `<pool>/<device>[/<shareID>]`): a claim shared by N pods has
`replicas` N and is entitled like a time-slicing replica, and a consumable-capacity share
carries its consumed memory in `AdvertisedDevice.entitlement_mib`, which wins over
memory/replicas (kind `mps` when the share runs under MPS, else `time-slicing`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from gpuslice.core.cgroups import CgroupIdentity, ContainerId, PodUid
from gpuslice.core.devices import Inventory
from gpuslice.core.sharing.model import AdvertisedDevice, Plan, SharingStrategy
from gpuslice.core.units import MIB

UnattributedReason = Literal["not-in-a-pod", "ambiguous", "no-holder"]
"""`not-in-a-pod`: no pod in its cgroup path (host process, MPS server); `no-holder`: its
pod holds no device on that GPU (or nobody does); `ambiguous`: several could own it."""


class Assignment(Protocol):
    """What PodResources says one container holds (`ports.ContainerDevices` has this shape)."""

    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def device_ids(self) -> tuple[str, ...]: ...


class Process(Protocol):
    """One NVML process (`ports.GpuProcess` has this shape)."""

    @property
    def pid(self) -> int: ...
    @property
    def gpu_uuid(self) -> str: ...
    @property
    def used_memory_bytes(self) -> int | None: ...
    @property
    def mig_uuid(self) -> str | None: ...
    @property
    def sm_util_percent(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Entitlement:
    kind: SharingStrategy
    """The sharing form (NONE: exclusive); `mig` wins over the others when a container
    mixes them."""
    memory_bytes: int
    sm_fraction: float | None
    """Share of the physical GPU's SMs; None for MIG when the parent's SM count is unknown."""


@dataclass(frozen=True, slots=True)
class ContainerGpuUsage:
    """One container on one physical GPU: what it uses and what it is entitled to."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    gpu_index: int
    resources: tuple[str, ...]
    device_ids: tuple[str, ...]
    physical_uuids: tuple[str, ...]
    """The GPU UUID, or the MIG device UUIDs held on it."""
    entitlement: Entitlement
    memory_used_bytes: int
    sm_util_percent: float | None
    """Sum of the processes' SM samples; None on MIG or when no process had a sample."""
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UnattributedProcess:
    pid: int
    gpu_uuid: str
    used_memory_bytes: int | None
    reason: UnattributedReason


@dataclass(frozen=True, slots=True)
class Attribution:
    usages: tuple[ContainerGpuUsage, ...]
    unattributed: tuple[UnattributedProcess, ...]
    unknown_device_ids: tuple[str, ...]
    """Device IDs PodResources listed that the plan does not advertise (other plugins'
    resources, or IDs from before a reload)."""
    learned_pods: Mapping[PodUid, tuple[str, str]]
    """UID -> (namespace, pod) learned by the sole-holder rule."""

    def for_pod(self, namespace: str, pod: str) -> tuple[ContainerGpuUsage, ...]:
        return tuple(u for u in self.usages if u.namespace == namespace and u.pod == pod)


_Key = tuple[str, str, str, str]
"""(namespace, pod, container, gpu_uuid)"""


@dataclass(slots=True)
class _Holding:
    gpu_index: int
    resources: list[str]
    devices: list[AdvertisedDevice]
    pids: list[int]
    memory: int = 0
    sm: float = 0.0
    sm_samples: int = 0


def attribute(
    assignments: Iterable[Assignment],
    plan: Plan,
    processes: Iterable[Process],
    identities: Mapping[int, CgroupIdentity],
    pods: Mapping[PodUid, tuple[str, str]] | None = None,
    *,
    inventory: Inventory | None = None,
    container_names: Mapping[ContainerId, str] | None = None,
) -> Attribution:
    """Join assignments, processes and cgroup identities (rules in the module docstring).

    `inventory` supplies the parent SM count for MIG entitlements; `container_names` (from
    pod status `containerID`s) picks the container when a pod has several on one GPU.
    """
    by_id = _advertised_by_id(plan)
    holdings: dict[_Key, _Holding] = {}
    holders_of: dict[str, set[_Key]] = defaultdict(set)
    """physical UUID (GPU or MIG) -> keys of containers holding a device on it."""
    holders_on_gpu: dict[str, set[_Key]] = defaultdict(set)
    unknown: list[str] = []
    for a in assignments:
        for device_id in a.device_ids:
            dev = by_id.get((a.resource, device_id)) or by_id.get(("", device_id))
            if dev is None:
                unknown.append(device_id)
                continue
            phys = dev.physical
            key: _Key = (a.namespace, a.pod, a.container, phys.gpu_uuid)
            holding = holdings.setdefault(key, _Holding(phys.gpu_index, [], [], []))
            if a.resource not in holding.resources:
                holding.resources.append(a.resource)
            holding.devices.append(dev)
            holders_of[phys.uuid].add(key)
            holders_on_gpu[phys.gpu_uuid].add(key)

    procs = list(processes)

    def candidates(p: Process) -> set[_Key]:
        exact = holders_of.get(p.mig_uuid or p.gpu_uuid)
        if exact:
            return exact
        if p.mig_uuid is None:
            return holders_on_gpu.get(p.gpu_uuid, set())
        return set()

    # Rule 2's evidence: which pod UIDs run on each physical device.
    uids_on: dict[str, set[PodUid]] = defaultdict(set)
    for p in procs:
        ident = identities.get(p.pid)
        if ident is not None:
            uids_on[p.mig_uuid or p.gpu_uuid].add(ident.pod_uid)

    learned: dict[PodUid, tuple[str, str]] = {}
    conflicting: set[PodUid] = set()
    for p in procs:
        ident = identities.get(p.pid)
        cands = candidates(p)
        if ident is None or len(cands) != 1 or len(uids_on[p.mig_uuid or p.gpu_uuid]) != 1:
            continue
        (ns, pod, _c, _g) = next(iter(cands))
        seen = learned.setdefault(ident.pod_uid, (ns, pod))
        if seen != (ns, pod):
            conflicting.add(ident.pod_uid)
    for uid in conflicting:
        learned.pop(uid, None)

    unattributed: list[UnattributedProcess] = []
    for p in procs:
        ident = identities.get(p.pid)
        if ident is None:
            unattributed.append(_unattributed(p, "not-in-a-pod"))
            continue
        cands = candidates(p)
        if not cands:
            unattributed.append(_unattributed(p, "no-holder"))
            continue
        owner = (pods or {}).get(ident.pod_uid) or learned.get(ident.pod_uid)
        chosen = _choose(cands, owner, ident, container_names)
        if not isinstance(chosen, tuple):
            unattributed.append(_unattributed(p, chosen))
            continue
        holding = holdings[chosen]
        holding.pids.append(p.pid)
        holding.memory += p.used_memory_bytes or 0
        if p.sm_util_percent is not None:
            holding.sm += p.sm_util_percent
            holding.sm_samples += 1

    sm_totals = _sm_totals(plan, inventory)
    usages = tuple(_usage(key, h, sm_totals.get(key[3])) for key, h in sorted(holdings.items()))
    return Attribution(
        usages=usages,
        unattributed=tuple(unattributed),
        unknown_device_ids=tuple(unknown),
        learned_pods=learned,
    )


def _advertised_by_id(plan: Plan) -> dict[tuple[str, str], AdvertisedDevice]:
    """(resource, id) -> device, plus ("", id) for lookups that ignore the resource name."""
    out: dict[tuple[str, str], AdvertisedDevice] = {}
    for resource in plan.resources:
        for dev in resource.devices:
            out[(resource.name, dev.id)] = dev
            out.setdefault(("", dev.id), dev)
    return out


def _choose(
    cands: set[_Key],
    owner: tuple[str, str] | None,
    ident: CgroupIdentity,
    container_names: Mapping[ContainerId, str] | None,
) -> _Key | UnattributedReason:
    """The holder a process belongs to, or why none can be named."""
    if owner is None:
        return "ambiguous"
    in_pod = [k for k in cands if (k[0], k[1]) == owner]
    if not in_pod:
        return "no-holder"
    if len(in_pod) == 1:
        return in_pod[0]
    if ident.container_id is not None and container_names is not None:
        name = container_names.get(ident.container_id)
        named = [k for k in in_pod if k[2] == name]
        if len(named) == 1:
            return named[0]
    return "ambiguous"


def _unattributed(p: Process, reason: UnattributedReason) -> UnattributedProcess:
    return UnattributedProcess(p.pid, p.gpu_uuid, p.used_memory_bytes, reason)


def _sm_totals(plan: Plan, inventory: Inventory | None) -> dict[str, int]:
    """GPU UUID -> SM count of the whole GPU (inventory first, then whole-GPU plan entries)."""
    totals: dict[str, int] = {}
    if inventory is not None:
        totals.update({g.uuid: g.multiprocessors for g in inventory.gpus})
    for resource in plan.resources:
        for dev in resource.devices:
            if dev.physical.kind == "gpu":
                totals.setdefault(dev.physical.gpu_uuid, dev.physical.multiprocessors)
    return totals


def entitlement_of(dev: AdvertisedDevice, gpu_sms: int | None) -> Entitlement:
    """What one advertised device (a replica, a MIG device, a whole GPU) entitles its holder to."""
    phys = dev.physical
    total_bytes = phys.memory_mib * MIB
    if phys.kind == "mig":
        fraction = phys.multiprocessors / gpu_sms if gpu_sms else None
        return Entitlement(SharingStrategy.MIG, total_bytes, fraction)
    replicas = max(1, dev.replicas)
    if dev.entitlement_mib is not None:
        # A DRA share: the scheduler sized its memory per claim (consumed capacity).
        if dev.mps is not None:
            return Entitlement(
                SharingStrategy.MPS,
                dev.entitlement_mib * MIB,
                dev.mps.active_thread_percentage / 100.0,
            )
        # Time-sliced, its SM share follows its memory: k of N default-sized shares is k/N
        # (to the MiB the scheduler rounded to), a larger memory request a larger share.
        fraction = min(1.0, dev.entitlement_mib / phys.memory_mib) if phys.memory_mib else None
        return Entitlement(SharingStrategy.TIME_SLICING, dev.entitlement_mib * MIB, fraction)
    if dev.mps is not None:
        return Entitlement(
            SharingStrategy.MPS,
            (dev.mps.pinned_memory_limit_mib or 0) * MIB,
            dev.mps.active_thread_percentage / 100.0,
        )
    if replicas == 1:
        return Entitlement(SharingStrategy.NONE, total_bytes, 1.0)
    # A device-plugin replica, or a DRA claim meant for `replicas` pods (GuardConfig sharedBy).
    return Entitlement(SharingStrategy.TIME_SLICING, total_bytes // replicas, 1.0 / replicas)


_KIND_ORDER: dict[SharingStrategy, int] = {
    SharingStrategy.MIG: 3,
    SharingStrategy.MPS: 2,
    SharingStrategy.TIME_SLICING: 1,
    SharingStrategy.NONE: 0,
}


def sum_entitlements(entitlements: list[Entitlement]) -> Entitlement:
    """Several devices on one GPU: their memory adds up, the kind that acts most wins."""
    kind = max((e.kind for e in entitlements), key=_KIND_ORDER.__getitem__)
    memory = sum(e.memory_bytes for e in entitlements)
    fractions = [e.sm_fraction for e in entitlements]
    sm: float | None = None
    if all(f is not None for f in fractions):
        sm = min(1.0, sum(f for f in fractions if f is not None))
    return Entitlement(kind, memory, sm)


def _usage(key: _Key, h: _Holding, gpu_sms: int | None) -> ContainerGpuUsage:
    ns, pod, container, gpu_uuid = key
    is_mig = any(d.physical.kind == "mig" for d in h.devices)
    no_sample = is_mig or (bool(h.pids) and h.sm_samples == 0)
    sm_util = None if no_sample else h.sm
    physical = tuple(dict.fromkeys(d.physical.uuid for d in h.devices))
    return ContainerGpuUsage(
        namespace=ns,
        pod=pod,
        container=container,
        gpu_uuid=gpu_uuid,
        gpu_index=h.gpu_index,
        resources=tuple(h.resources),
        device_ids=tuple(d.id for d in h.devices),
        physical_uuids=physical,
        entitlement=sum_entitlements([entitlement_of(d, gpu_sms) for d in h.devices]),
        memory_used_bytes=h.memory,
        sm_util_percent=sm_util,
        pids=tuple(sorted(h.pids)),
    )
