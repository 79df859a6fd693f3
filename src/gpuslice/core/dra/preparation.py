"""The steps that prepare one claim on this node, as data: which GPUs go to EXCLUSIVE_PROCESS
for their MPS daemon, which MPS daemons must answer, which time-slice intervals to set, what
each step records for Unprepare, the CDI devices to write and what the claim's pods are
entitled to.

The driver carries the steps out (`agent.dra_driver`); `gpuslice describe --claims` shows
them without running any (`whatif.claims`). One derivation serves both, so what the
what-if view predicts is what Prepare does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpuslice.core.cdi.spec import CdiDevice, MpsMounts
from gpuslice.core.dra.claims import (
    ClaimError,
    ClaimWork,
    DeviceWork,
    GroupWork,
    daemon_spec,
    group_daemon_spec,
    share_daemon_key,
    share_envs,
)
from gpuslice.core.dra.prepared import AppliedSharing, DeviceUse
from gpuslice.core.migcaps import access_files
from gpuslice.core.mps import MpsDaemonSpec
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB


@dataclass(frozen=True, slots=True)
class StartDaemon:
    """An MPS control daemon that must answer before Prepare does."""

    spec: MpsDaemonSpec
    record: AppliedSharing


@dataclass(frozen=True, slots=True)
class SetInterval:
    """A time-slice interval for one whole GPU (`nvidia-smi compute-policy`)."""

    gpu_uuid: str
    interval: int
    source: str
    """The config entry that asked for it, for the claim's error message."""
    record: AppliedSharing


@dataclass(frozen=True, slots=True)
class SetComputeMode:
    """EXCLUSIVE_PROCESS on a whole GPU before its MPS daemon starts (NVIDIA sets it so only
    the MPS server opens the GPU). A step of its own, recorded before it is taken, so the
    undo of a Prepare cut short by a crash (the next agent's, or the kubelet's Unprepare)
    resets it: a GPU left in EXCLUSIVE_PROCESS fails every later claim with more than one
    CUDA process. A MIG daemon has none: the mode is the whole GPU's."""

    gpu_uuid: str
    record: AppliedSharing


Step = SetComputeMode | StartDaemon | SetInterval

COMPUTE_MODE = "ComputeMode"
"""The `strategy` of a compute-mode step's record (`AppliedSharing`)."""


def exclusive(gpu_uuid: str) -> SetComputeMode:
    return SetComputeMode(
        gpu_uuid, AppliedSharing(COMPUTE_MODE, (gpu_uuid,), compute_mode="EXCLUSIVE_PROCESS")
    )


def with_compute_modes(applied: Sequence[AppliedSharing]) -> tuple[AppliedSharing, ...]:
    """`applied` as this version records it: a record written before the compute mode was a
    step of its own has a whole-GPU MPS daemon and no compute-mode step, though the agent
    that wrote it set EXCLUSIVE_PROCESS on that GPU wherever the node sets compute modes.
    The step is added before its daemon, so Unprepare resets the mode as for a claim
    prepared now."""
    recorded = {u for a in applied if a.compute_mode for u in a.gpu_uuids}
    out: list[AppliedSharing] = []
    for a in applied:
        if a.mps_key and not a.mig_uuids:
            for uuid in a.gpu_uuids:
                if uuid not in recorded:
                    recorded.add(uuid)
                    out.append(exclusive(uuid).record)
        out.append(a)
    return tuple(out)


SHARES_RECORD = "mps-shares"
"""The record of a claim's MPS shares: their GPU's share daemon (`share_daemon_spec`)."""


@dataclass(frozen=True, slots=True)
class Preparation:
    steps: tuple[Step, ...]
    """In order; each one's `record` is kept once it is done, so a failure undoes exactly
    what was done."""
    cdi: tuple[CdiDevice, ...]
    uses: tuple[DeviceUse, ...]


def preparation(work: ClaimWork, mps_root: str) -> Preparation:
    """Everything Prepare does for `work`. ClaimError (from the MPS limits' keys) when a
    config cannot be applied."""
    steps: list[Step] = []
    cdi: list[CdiDevice] = []
    uses: list[DeviceUse] = []
    for group in work.groups:
        if any(d.share is not None for d in group.devices):
            for dw in group.devices:
                _share(dw, mps_root, steps, cdi, uses)
        elif group.sharing.shares is SharingStrategy.MPS:
            _mps(work.ref.uid, group, mps_root, steps, cdi, uses)
        else:
            _time_slicing(group, steps, cdi, uses)
    return Preparation(tuple(steps), tuple(cdi), tuple(uses))


def _device(dw: DeviceWork, mounts: MpsMounts | None = None, **env: str) -> CdiDevice:
    """The device's CDI edits. A MIG device whose capability minors the backend could not
    read is refused: without its capability nodes a container cannot open it, and a claim
    error says why where a started container would only fail obscurely."""
    device = dw.device
    caps: tuple[int, ...] = ()
    major = None
    if device.kind == "mig" and device.mig is None:
        # a dynamic MIG partition (`core.dra.partitions`) before its instance exists
        raise ClaimError(
            f"MIG device {device.name} has not been created on GPU {device.gpu.uuid}; "
            "there is nothing a container could open yet"
        )
    if device.mig is not None:
        if device.mig.cap_minors is None:
            gi, ci = access_files(device.gpu.minor, device.mig.gi_id, device.mig.ci_id)
            raise ClaimError(
                f"MIG device {device.name}: its capability minors could not be read from "
                f"{gi} and {ci}; a container could not open it"
            )
        caps, major = device.mig.cap_minors, device.mig.cap_major
    return CdiDevice(
        device.name,
        device.uuid,
        device.gpu.minor,
        mounts,
        env or None,
        dw.request_name,
        caps,
        major,
    )


def _share(
    dw: DeviceWork,
    mps_root: str,
    steps: list[Step],
    cdi: list[CdiDevice],
    uses: list[DeviceUse],
) -> None:
    share = dw.share
    assert share is not None
    gpu = dw.device.gpu
    use = DeviceUse(
        dw.device.name,
        dw.device.uuid,
        share.strategy,
        share.replicas,
        dw.share_id,
        # what it reserved; 0 for a share that reserved none (guaranteed nothing, and
        # held to what no share on the GPU reserved: `core.protection`); None on a
        # unified-memory GPU, which has no memory figure to reserve from
        share.memory_mib if dw.device.capacity.get("memory", 0) // MIB else None,
        share.thread_percentage if share.strategy == SharingStrategy.MPS else None,
        admin=dw.admin,
    )
    mounts = None
    if share.strategy == SharingStrategy.MPS:
        # this claim's share alone: the driver sizes the daemon by every share on the GPU
        spec = share_daemon_spec(mps_root, gpu.uuid, gpu.index, [use], gpu.memory_mib or None)
        record = AppliedSharing(SHARES_RECORD, (gpu.uuid,), mps_key=spec.resource)
        steps.append(exclusive(gpu.uuid))
        steps.append(StartDaemon(spec, record))
        mounts = MpsMounts(spec.pipe_dir, spec.shm_dir)
    cdi.append(_device(dw, mounts, **share_envs(share, dw.device.capacity.get("memory", 0) // MIB)))
    uses.append(use)


def share_daemon_spec(
    mps_root: str,
    gpu_uuid: str,
    gpu_index: int,
    uses: Iterable[DeviceUse],
    gpu_memory_mib: int | None = None,
) -> MpsDaemonSpec:
    """The daemon serving every MPS share of one GPU, its defaults the largest share prepared
    there (`uses`: every claim's, prepared or being prepared).

    A client's `CUDA_MPS_*` variables can only lower the daemon's defaults, and a client can
    unset them: with the defaults at 100 % and no pinned limit, a pod that unsets two
    variables holds the whole GPU. So the defaults are no larger than what one share may
    hold on the GPU, and no smaller, or the largest share's own clients would be held below
    what it reserved (its env cannot raise them). What a smaller share takes above its own
    reservation up to the largest is the enforcing guard's to act on. The defaults change as
    shares come and go, sent to the running daemon (`MpsDaemonSpec.retunable`): a restart
    would cut every share's clients. A share that reserved no memory (NVIDIA's share modes)
    may hold what no share on the GPU reserved (`core.protection`'s hard limit for it), so
    the default is the larger of that and the largest reservation, never the whole GPU on
    top of the others' reservations; without the GPU's memory (`gpu_memory_mib`, unknown on
    a unified-memory GPU) such a GPU has no pinned default. Admin claims are not tenants and
    size nothing."""
    shares = [
        u
        for u in uses
        if u.strategy == SharingStrategy.MPS
        and u.share_id is not None
        and u.physical_uuid == gpu_uuid
        and not u.admin
    ]
    percentage = max((u.thread_percentage or 100 for u in shares), default=100)
    memory = [u.entitlement_mib or 0 for u in shares]
    limits: dict[int, int] = {}
    if shares and min(memory) > 0:
        limits = {gpu_index: max(memory)}
    elif shares and gpu_memory_mib:
        unreserved = max(0, gpu_memory_mib - sum(memory))
        limits = {gpu_index: max(max(memory), unreserved)}
    spec = daemon_spec(
        share_daemon_key(gpu_uuid),
        mps_root,
        [(gpu_uuid, gpu_index)],
        thread_percentage=percentage,
        limits_mib=limits,
    )
    return replace(spec, retunable=True)


def _mps(
    claim_uid: str,
    group: GroupWork,
    mps_root: str,
    steps: list[Step],
    cdi: list[CdiDevice],
    uses: list[DeviceUse],
) -> None:
    spec = group_daemon_spec(claim_uid, group, mps_root)
    assert spec is not None
    record = AppliedSharing(
        SharingStrategy.MPS.nvidia_name,
        spec.gpu_uuids,
        mps_key=spec.resource,
        thread_percentage=spec.active_thread_percentage,
        limits_mib=spec.pinned_mem_limits_mib,
        mig_uuids=spec.mig_uuids,
        multi_user=spec.multi_user,
    )
    if not spec.mig_uuids:
        steps.extend(exclusive(uuid) for uuid in spec.gpu_uuids)
    steps.append(StartDaemon(spec, record))
    limits = dict(spec.pinned_mem_limits_mib)
    mounts = MpsMounts(spec.pipe_dir, spec.shm_dir)
    for dw in group.devices:
        # the limit's index: the GPU's, or the MIG device's place among the daemon's devices
        index = spec.mig_uuids.index(dw.device.uuid) if spec.mig_uuids else dw.device.gpu.index
        cdi.append(_device(dw, mounts))
        uses.append(
            DeviceUse(
                dw.device.name,
                dw.device.uuid,
                SharingStrategy.MPS,
                group.sharing.shared_by or 1,
                entitlement_mib=limits.get(index),
                thread_percentage=spec.active_thread_percentage,
                admin=dw.admin,
            )
        )


def _time_slicing(
    group: GroupWork, steps: list[Step], cdi: list[CdiDevice], uses: list[DeviceUse]
) -> None:
    sharing = group.sharing
    if sharing.interval is not None:
        whole = dict.fromkeys(d.device.gpu.uuid for d in group.devices if d.device.mig is None)
        for uuid in whole:
            record = AppliedSharing(
                SharingStrategy.TIME_SLICING.nvidia_name, (uuid,), interval=sharing.interval
            )
            steps.append(SetInterval(uuid, sharing.interval, sharing.source, record))
    shared_by = sharing.shared_by or 1
    shared = sharing.shares is SharingStrategy.TIME_SLICING or shared_by > 1
    strategy = SharingStrategy.TIME_SLICING if shared else SharingStrategy.NONE
    for dw in group.devices:
        cdi.append(_device(dw))
        uses.append(DeviceUse(dw.device.name, dw.device.uuid, strategy, shared_by, admin=dw.admin))
