"""From an allocated ResourceClaim to what Prepare must do on this node, with no I/O.

The kubelet sends only a claim's namespace, UID and name; the driver reads the claim and
must then decide, for each allocation result of this driver, which device it is, which
sharing applies (NVIDIA's opaque configs, `core.dra.sharing`) and, for a device offered as
consumable shares, how much of it the claim got. Every reason to refuse is a `ClaimError`
whose text goes back to the kubelet (and into the pod's events), so each one names the
claim's field and value: a claim replaced under the same name, one not allocated yet, a
result naming a device this node no longer has, a config this driver cannot apply.

Results are grouped per resolved config as NVIDIA's driver does, so one MPS daemon or one
time-slice setting serves all devices a config applies to.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuslice.core.devices import GpuUuid
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import (
    CORES_CAPACITY,
    SHARES_CAPACITY,
    DraDevice,
    ShareOffer,
)
from gpuslice.core.dra.resource_claim import DeviceResult, ResourceClaim
from gpuslice.core.dra.sharing import (
    INTERVALS,
    ClaimConfigError,
    Sharing,
    resolve,
)
from gpuslice.core.errors import GpusliceError
from gpuslice.core.mps import READY_MARKER, STARTED_MARKER, MpsDaemonSpec
from gpuslice.core.sharing.model import ResourceName, SharingStrategy
from gpuslice.core.text import shown_all
from gpuslice.core.units import MIB, quantity_mib

__all__ = [
    "CORES_CAPACITY",
    "SHARES_CAPACITY",
    "ClaimError",
    "ClaimWork",
    "DeviceWork",
    "ShareOffer",
    "ShareUse",
]


class ClaimError(GpusliceError):
    """This claim cannot be prepared here; the text is the claim's error for the kubelet."""


@dataclass(frozen=True, slots=True)
class ShareUse:
    """What one claim took of a shared GPU: shares of `replicas`, memory and compute."""

    shares: int
    replicas: int
    memory_mib: int
    """0: the claim reserved no memory (NVIDIA's `unlimited` and count modes by default), so
    it is given no memory limit or hint."""
    strategy: SharingStrategy
    cores: int = 0
    """The percentage of the SMs the claim reserved (`cores`); 0 when it asked for none."""

    @property
    def thread_percentage(self) -> int:
        """The MPS client limit: the compute the claim reserved, else its fraction of the
        shares; at least 1 %."""
        if self.cores > 0:
            return min(100, self.cores)
        return max(1, min(100, 100 * self.shares // self.replicas))


@dataclass(frozen=True, slots=True)
class DeviceWork:
    request: str
    """The allocation result's request (`main/sub` for a firstAvailable subrequest)."""
    device: DraDevice
    sharing: Sharing
    share_id: str | None = None
    share: ShareUse | None = None
    admin: bool = False
    """`adminAccess`: a monitoring or debugging claim that may reach a device another
    claim holds (Kubernetes allows it only in namespaces labelled for admin access)."""

    @property
    def request_name(self) -> str:
        """What the kubelet matches against a container's claim reference (`main`)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class GroupWork:
    """Devices one resolved config applies to: configured once, undone once."""

    sharing: Sharing
    devices: tuple[DeviceWork, ...]

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.device.gpu.uuid for d in self.devices))


@dataclass(frozen=True, slots=True)
class ClaimWork:
    ref: ClaimRef
    devices: tuple[DeviceWork, ...]
    groups: tuple[GroupWork, ...]
    notices: tuple[str, ...] = ()
    """What the claim asked for and does not get, where the node's setting is kept instead
    of failing the pod (a claim's TimeSlicing config on a share): the driver posts each as
    a Warning Event, so the pod runs as it would on NVIDIA's driver and is told so."""

    @property
    def guard_mode(self) -> str | None:
        """The claim's GuardConfig mode: the first of its devices' that sets one."""
        return next((d.sharing.guard_mode for d in self.devices if d.sharing.guard_mode), None)


def claim_work(
    claim: ResourceClaim | Mapping[str, Any],
    ref: ClaimRef,
    *,
    driver: str,
    pool: str,
    devices: Mapping[str, DraDevice],
    offers: Mapping[str, ShareOffer],
) -> ClaimWork:
    """What preparing `claim` means on this node; ClaimError says why it cannot be.
    `claim`: read (`ResourceClaim.read`) unless it already is."""
    where = f"ResourceClaim {ref.namespace}/{ref.name}"
    if not isinstance(claim, ResourceClaim):
        claim = ResourceClaim.read(claim)
    if not claim.is_object:
        raise ClaimError(f"{where}: not an object")
    if claim.uid != ref.uid:
        raise ClaimError(
            f"{where} has UID {claim.uid!r}, not {ref.uid!r}: it was deleted and created again"
        )
    allocation = claim.allocation
    if allocation is None:
        raise ClaimError(f"{where}: status.allocation is missing (the claim is not allocated)")
    if allocation.results is None:
        raise ClaimError(f"{where}: status.allocation.devices.results is missing")
    ours = [r for r in allocation.results if r.driver == driver]
    if not ours:
        raise ClaimError(f"{where}: no allocation result is for driver {driver!r}")
    kind_of = {name: d.kind for name, d in devices.items()}
    seen: dict[str, int] = {}
    for result in ours:
        field = f"status.allocation.devices.results[{result.index}]"
        if result.pool != pool:
            raise ClaimError(
                f"{where}: {field}.pool is {result.pool!r}; this node's pool is {pool!r}"
            )
        name = result.device
        if name not in devices:
            raise ClaimError(
                f"{where}: {field}.device {name!r} is not a device of this node "
                # a few of them: a dynamic MIG node has hundreds (1 KB for one H100)
                f"(now: {shown_all(sorted(devices)) or 'none'})"
            )
        if not result.share_id:
            if name in seen:
                raise ClaimError(f"{where}: {field} allocates device {name!r} a second time")
            seen[name] = result.index
    try:
        sharing = resolve(allocation, driver, kind_of)
    except ClaimConfigError as exc:
        raise ClaimError(f"{where}: status.allocation.devices.{exc}") from None
    work: list[DeviceWork] = []
    notices: list[str] = []
    for result in ours:
        device = devices[result.device]
        chosen = sharing[result.index]
        share_id = result.share_id or None
        share = None
        if share_id is not None:
            at = f"{where}: results[{result.index}]"
            share = _share_use(result, device, offers.get(device.name), at)
            chosen, notice = _on_a_share(chosen, device, share, where)
            if notice is not None:
                notices.append(notice)
        work.append(
            DeviceWork(result.request, device, chosen, share_id, share, result.admin_access)
        )
    return ClaimWork(ref, tuple(work), _groups(work), tuple(dict.fromkeys(notices)))


def _on_a_share(
    chosen: Sharing, device: DraDevice, share: ShareUse, where: str
) -> tuple[Sharing, str | None]:
    """A claim's own sharing config on a device the node offers as shares.

    MPS is refused, as NVIDIA's driver refuses it where it cannot apply it. TimeSlicing is
    what NVIDIA's driver applies on any GPU, so a pod written for it must run here too; but
    the GPU is shared by other claims on the node's terms (a time-slice interval is
    GPU-wide, and MPS shares are served by one daemon), so the node's setting is kept and
    the claim is told (the notice), rather than failed."""
    shared = f"{device.name}, which this node offers as shares ({share.replicas}, {share.strategy})"
    if chosen.shares is SharingStrategy.MPS:
        raise ClaimError(
            f"{where}: {chosen.source} asks for MPS on device {shared}: the node's config "
            "sets how shares are shared"
        )
    if chosen.shares is not SharingStrategy.TIME_SLICING:
        return chosen, None
    kept = replace(
        chosen, sharing=replace(chosen.sharing, strategy=SharingStrategy.NONE, interval=None)
    )
    if share.strategy == SharingStrategy.TIME_SLICING and chosen.interval is None:
        return kept, None  # time-slicing as asked: nothing differs
    names = {v: k for k, v in INTERVALS.items()}
    asked = SharingStrategy.TIME_SLICING.nvidia_name + (
        "" if chosen.interval is None else f" ({names[chosen.interval]})"
    )
    return kept, (
        f"{where}: {chosen.source} asks for {asked} on device {shared}; the node's "
        f"{share.strategy} sharing is kept (its config sets how shares are shared) and the "
        "claim is prepared with it"
    )


def _share_use(
    result: DeviceResult, device: DraDevice, offer: ShareOffer | None, where: str
) -> ShareUse:
    """What the allocation consumed, as the scheduler recorded it; where a capacity is not
    recorded, what the device's policy gives by default."""
    consumed = result.consumed_capacity
    mode = offer.mode if offer is not None else "replicas"
    replicas = offer.replicas if offer is not None and offer.counted else 1
    strategy = offer.strategy if offer is not None else SharingStrategy.TIME_SLICING
    total_mib = device.capacity.get("memory", 0) // MIB
    may_take_none = mode in ("unlimited", "count")
    # the default the slice published for the device (`ShareOffer.default_memory_mib`)
    default_mib = offer.default_memory_mib if offer is not None else total_mib
    try:
        memory = consumed.get("memory")
        if memory is None:
            memory_mib = default_mib
        elif may_take_none and _is_zero(memory):
            memory_mib = 0
        else:
            memory_mib = quantity_mib(memory)
        raw_shares = consumed.get(SHARES_CAPACITY)
        shares = int(str(raw_shares)) if raw_shares is not None and _counts(offer) else 1
        raw_cores = consumed.get(CORES_CAPACITY)
        cores = int(str(raw_cores)) if raw_cores is not None else 0
    except (ValueError, TypeError) as exc:
        raise ClaimError(f"{where}.consumedCapacity: {exc}") from None
    # a unified-memory GPU publishes no memory capacity: shared by count only, and a share's
    # memory is 0 (no limit, no memory hint)
    low = 0 if may_take_none or total_mib == 0 else 1
    if shares < 1 or not low <= memory_mib <= max(total_mib, 1) or not 0 <= cores <= 100:
        raise ClaimError(
            f"{where}.consumedCapacity: {dict(consumed)!r} does not fit device {device.name}"
        )
    return ShareUse(min(shares, replicas), replicas, memory_mib, strategy, cores)


def _counts(offer: ShareOffer | None) -> bool:
    """Whether the device counts shares (an unknown offer: as `replicas` mode did)."""
    return offer is None or offer.counted


def _is_zero(value: object) -> bool:
    """A quantity of nothing (`0`, `0Mi`), which `quantity_mib` refuses as below 1Mi."""
    return re.fullmatch(r"\s*0+(?:\.0*)?\s*(?:[KMGTPE]i?|k)?\s*", str(value)) is not None


def _groups(work: Sequence[DeviceWork]) -> tuple[GroupWork, ...]:
    keyed: dict[tuple[object, ...], list[DeviceWork]] = {}
    for d in work:
        s = d.sharing
        # one group per config: the sharing slot's entry (its MPS settings are not hashable)
        # and the other slots' records whole, so a field added to a slot needs nothing here
        key = (s.source, s.kind, s.strategy, s.guard, d.share is not None)
        keyed.setdefault(key, []).append(d)
    return tuple(GroupWork(items[0].sharing, tuple(items)) for items in keyed.values())


# -- MPS daemons for claims --------------------------------------------------------------


def claim_daemon_key(claim_uid: str, gpu_uuids: Sequence[str]) -> str:
    """NVIDIA's daemon ID shape: `<claim UID>-<5 hex of sha256 of the GPU UUIDs>`."""
    digest = hashlib.sha256(",".join(gpu_uuids).encode()).hexdigest()[:5]
    return f"{claim_uid}-{digest}"


def share_daemon_key(gpu_uuid: str) -> str:
    """One daemon per shared GPU, serving every MPS share claim on it. Short: the daemon's
    control socket lives at `<root>/<key>/pipe/control` and a unix socket path has 107
    bytes at most (`/var/lib/kubelet/plugins/gpu.nvidia.com/mps/` takes 44)."""
    return f"shares-{hashlib.sha256(gpu_uuid.encode()).hexdigest()[:12]}"


def daemon_spec(
    key: str,
    root: str,
    gpus: Sequence[tuple[str, int]],
    *,
    thread_percentage: int | None = None,
    limits_mib: Mapping[int, int] | None = None,
    mig_uuids: Sequence[str] = (),
    multi_user: bool = False,
) -> MpsDaemonSpec:
    """A control daemon under `<root>/<key>/` for `gpus` ((UUID, index) pairs), serving
    the MIG devices `mig_uuids` of those GPUs when given (see `MpsDaemonSpec`)."""
    base = f"{root.rstrip('/')}/{key}"
    return MpsDaemonSpec(
        resource=ResourceName(key),
        root=root.rstrip("/"),
        pipe_dir=f"{base}/pipe",
        log_dir=f"{base}/log",
        shm_dir=f"{base}/shm",
        started_marker=f"{base}/{STARTED_MARKER}",
        ready_marker=f"{root.rstrip('/')}/{READY_MARKER}",
        gpu_uuids=tuple(GpuUuid(u) for u, _ in gpus),
        gpu_indices=tuple(i for _, i in gpus),
        active_thread_percentage=100 if thread_percentage is None else thread_percentage,
        pinned_mem_limits_mib=tuple(sorted((limits_mib or {}).items())),
        mig_uuids=tuple(mig_uuids),
        multi_user=multi_user,
    )


def group_daemon_spec(claim_uid: str, group: GroupWork, root: str) -> MpsDaemonSpec | None:
    """The daemon an MPS config group gets (None when the group is not MPS): its
    defaults are the config's thread percentage and pinned limits (per device UUID or
    index into the group's devices, as NVIDIA reads `defaultPerDevicePinnedMemoryLimit`).

    A `MigDeviceConfig` group's daemon serves its MIG devices as NVIDIA's driver runs it:
    they are its `CUDA_VISIBLE_DEVICES`, its ID is hashed from their UUIDs, and the limit
    keys are their UUIDs or indices into them, sorted as NVIDIA sorts them (so a claim's
    `"0"` means the same device on both drivers). The daemon numbers the devices it sees
    from 0, so a MIG device's limit is sent for its position there."""
    mps = group.sharing.mps
    if group.sharing.shares is not SharingStrategy.MPS or mps is None:
        return None
    gpus: dict[str, int] = {}
    for d in group.devices:
        gpus.setdefault(d.device.gpu.uuid, d.device.gpu.index)
    mig = group.sharing.kind == "mig"
    units = sorted({d.device.uuid for d in group.devices}) if mig else list(gpus)
    known = set(units) | {str(i) for i in range(len(units))}
    for key in mps.per_device_limit_mib:
        if key not in known:
            raise ClaimError(
                f"{group.sharing.source}: mpsConfig.defaultPerDevicePinnedMemoryLimit key "
                f"{key!r} is neither a UUID of the config's devices nor an index below "
                f"{len(units)}"
            )
    if mps.multi_user:
        _check_multi_user(group)
    limits: dict[int, int] = {}
    for position, uuid in enumerate(units):
        limit = mps.limit_for(uuid, position)
        if limit is not None:
            limits[position if mig else gpus[uuid]] = limit
    return daemon_spec(
        claim_daemon_key(claim_uid, units),
        root,
        list(gpus.items()),
        thread_percentage=mps.active_thread_percentage,
        limits_mib=limits,
        mig_uuids=units if mig else (),
        multi_user=mps.multi_user,
    )


VOLTA = (7, 0)
"""Multi-user MPS needs compute capability 7.0 or newer (NVIDIA's driver checks the same)."""


def _check_multi_user(group: GroupWork) -> None:
    for d in group.devices:
        if d.device.gpu.compute_capability < VOLTA:
            major, minor = d.device.gpu.compute_capability
            raise ClaimError(
                f"{group.sharing.source}: mpsConfig.multiUser true needs a Volta or newer GPU "
                f"(compute capability 7.0); device {d.device.name} has {major}.{minor}"
            )


def share_envs(share: ShareUse, total_mib: int) -> dict[str, str]:
    """What a share's containers are told: MPS client limits (enforced by the MPS server),
    or for time-slicing the same memory hints the device plugin gives replicas. A share that
    reserved no memory gets no memory limit or hint: it asked for none of it, and a hint of
    the whole GPU would make frameworks that preallocate (XLA) take it from its neighbours."""
    if share.strategy == SharingStrategy.MPS:
        env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share.thread_percentage)}
        if share.memory_mib > 0:  # 0: none reserved, or a unified-memory GPU
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={share.memory_mib}M"
        return env
    if total_mib == 0:  # unified memory: the SM-time fraction only, no memory limit
        text = f"{math.floor(share.shares / share.replicas * 10_000) / 10_000:.4f}"
        text = text.rstrip("0").rstrip(".")
        return {
            "GPUSLICE_GPU_FRACTION": text,
            "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": text,
        }
    if share.memory_mib == 0:
        return {}
    fraction = min(1.0, share.memory_mib / total_mib) if total_mib else 1.0
    if share.memory_mib == total_mib * share.shares // share.replicas:
        fraction = share.shares / share.replicas  # the default size: exactly k of N
    text = f"{math.floor(fraction * 10_000) / 10_000:.4f}".rstrip("0").rstrip(".")
    return {
        "GPUSLICE_GPU_FRACTION": text,
        "GPUSLICE_MEMORY_LIMIT_MIB": str(share.memory_mib),
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": text,
    }
