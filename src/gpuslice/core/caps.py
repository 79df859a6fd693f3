"""Memory caps: where the driver can hold each shared tenant to its GPU memory, and to what.

NVML from driver branch r615 (CUDA 13.4) sets per-cgroup memory limits on a GPU
(`nvmlDeviceSetMemoryLimits_v1`, read back with `nvmlDeviceGetMemoryLimits_v1`, which also
gives the memory the cgroup uses). NVIDIA's API reference says: `nameSpace` is the full
sysfs path of the cgroup; the soft limit is the memory guaranteed before allocations may
fail due to memory pressure; the hard limit is the most that can be allocated; soft 0 and
hard `NVML_DEVICE_MEMORY_LIMIT_MAX` is "no limit" (and clears one); removing the cgroup
clears them too; MIG handles are not supported; Linux only, root only. Units are bytes.

A cap is the driver's answer to what the memory guard (`core.guard`) can only do after the
fact: with it, a tenant that overruns fails its *own* allocation, and nobody is stopped. So
this module decides, per GPU, which protection it gets (`protection`), and per tenant, which
limits (`limits_for`); the adapters apply them (the CDI hook before the container runs, or
the agent right after) and the guard steps back on the GPUs that are capped.

What is *not* documented, and so not assumed here: how the driver honours a soft limit (the
simulator reads it as memory held back for that cgroup, `core.gpumemory`), what a hard
limit set below the memory a cgroup already holds does to that memory, and how caps
interact with MPS (an MPS client's memory is allocated through the MPS server; which
cgroup the driver charges is not said). So MPS tenants keep only their pinned limit, which
the MPS server enforces, and get no cap from gpuslice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Literal

from gpuslice.core.attribution import Assignment, Entitlement, entitlement_of
from gpuslice.core.guard.model import ContainerKey, Tenant
from gpuslice.core.sharing.model import AdvertisedDevice, Plan

MIB = 1024 * 1024

LIMIT_MAX = 0xFFFF_FFFF_FFFF_FFFF
"""`NVML_DEVICE_MEMORY_LIMIT_MAX`: a hard limit of this is no hard limit."""

CapPolicy = Literal["strict", "borrow"]
"""The hard limit a capped tenant gets: `strict` (default) its entitlement, so an overrun
fails at once; `borrow` the whole GPU, so it may use what the others' soft limits do not
hold back, as the guard lets pods borrow today (a pod that arrives later may then find its
share taken: see docs/memory-guard.md)."""

CapsMode = Literal["off", "auto"]
"""`auto`: cap wherever the GPU, the driver and the node allow it; `off`: never."""

Protection = Literal["capped", "guarded", "none"]
"""What holds a GPU's tenants to their memory: the driver (`capped`), the memory guard
(`guarded`: it observes or enforces), or nothing."""

Refusal = Literal[
    "caps-off",
    "mig",
    "unified-memory",
    "driver-without-call",
    "cgroup-v1",
    "not-root",
    "nvml-error",
]
"""Why a GPU is not capped: caps turned off; a MIG GPU (NVML refuses MIG handles); a
unified-memory GPU (no memory figure to split); a driver older than r615 (the function is
missing); a node on cgroup v1 (the toolkit's hook fails there, and the limits are keyed by a
cgroup v2 path); an agent that is not root; NVML failed the call."""

REFUSAL_TEXT: Mapping[Refusal, str] = {
    "caps-off": "memory caps are turned off (--memory-caps off)",
    "mig": "MIG mode: NVML does not set memory limits on MIG devices",
    "unified-memory": "unified memory: NVML reports no GPU memory to split",
    "driver-without-call": "the driver has no nvmlDeviceSetMemoryLimits_v1 (needs r615+)",
    "cgroup-v1": "the node runs cgroup v1; memory limits need cgroup v2",
    "not-root": "the agent is not root; setting memory limits needs root",
    "nvml-error": "NVML failed to set or read a memory limit",
}


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """One cgroup's limits on one GPU, in bytes (`used_bytes` only when read back)."""

    soft_bytes: int
    hard_bytes: int
    used_bytes: int | None = None

    @property
    def cleared(self) -> bool:
        return self.soft_bytes == 0 and self.hard_bytes == LIMIT_MAX

    def same_limits(self, other: MemoryLimits) -> bool:
        """Equal soft and hard limits (what the agent checks; usage is not a limit)."""
        return (self.soft_bytes, self.hard_bytes) == (other.soft_bytes, other.hard_bytes)

    def __str__(self) -> str:
        hard = "max" if self.hard_bytes == LIMIT_MAX else f"{self.hard_bytes // MIB}MiB"
        return f"soft {self.soft_bytes // MIB}MiB hard {hard}"


CLEARED = MemoryLimits(0, LIMIT_MAX)


@dataclass(frozen=True, slots=True)
class NodeCapability:
    """What the node allows, whatever the GPU: found once at start by the agent."""

    cgroup_v2: bool
    root: bool

    def refusal(self) -> Refusal | None:
        if not self.cgroup_v2:
            return "cgroup-v1"
        if not self.root:
            return "not-root"
        return None


@dataclass(frozen=True, slots=True)
class GpuCapability:
    """Whether one GPU's tenants can be capped, and if not, the one reason why."""

    gpu_uuid: str
    refusal: Refusal | None = None

    @property
    def capable(self) -> bool:
        return self.refusal is None

    @property
    def reason(self) -> str:
        return "" if self.refusal is None else REFUSAL_TEXT[self.refusal]


def gpu_capability(
    gpu_uuid: str,
    *,
    mode: CapsMode,
    mig_enabled: bool,
    memory_reported: bool,
    driver_has_call: bool,
    node: NodeCapability,
) -> GpuCapability:
    """The capability of one GPU. One reason only, the most basic first: a node on cgroup v1
    with an old driver is told about the driver first, since that is the one that needs a
    maintenance window; MIG comes before both as it is a choice of the GPU's owner."""
    refusal: Refusal | None
    if mode == "off":
        refusal = "caps-off"
    elif mig_enabled:
        refusal = "mig"
    elif not memory_reported:
        refusal = "unified-memory"
    elif not driver_has_call:
        refusal = "driver-without-call"
    else:
        refusal = node.refusal()
    return GpuCapability(gpu_uuid, refusal)


def protection(capability: GpuCapability | None, guard_mode: str) -> Protection:
    """What holds a GPU's tenants to their share: the driver where it can, else the guard
    when it runs (observe or enforce), else nothing."""
    if capability is not None and capability.capable:
        return "capped"
    return "guarded" if guard_mode in ("observe", "enforce") else "none"


def limits_for(
    entitlement: Entitlement, gpu_total_bytes: int, policy: CapPolicy
) -> MemoryLimits | None:
    """The limits of one tenant on one GPU, None for a tenant that gets no cap.

    Only time-sliced tenants (replicas, DRA shares not under MPS, claims shared by pods) are
    capped: an exclusive holder has nobody to protect, a MIG device has its own memory, and
    an MPS client keeps the pinned limit its MPS server enforces (see the module docstring).
    soft = the entitlement the guard already computes; hard by `policy`."""
    if entitlement.kind != "time-slicing" or gpu_total_bytes <= 0:
        return None
    soft = max(0, min(entitlement.memory_bytes, gpu_total_bytes))
    hard = soft if policy == "strict" else gpu_total_bytes
    return MemoryLimits(soft, hard)


class CapsRequestError(ValueError):
    """Limits that cannot be asked for (a request above the limit, a negative size)."""


def hook_env(limits: MemoryLimits) -> dict[str, str]:
    """The environment the toolkit's `apply-cuda-memory-limits` hook reads: integers in MiB
    (`NVIDIA_GPU_MEMORY_REQUEST` the soft limit, `NVIDIA_GPU_MEMORY_LIMIT` the hard one). Both
    are rounded down to the MiB, so the hook never sets more than the entitlement; a request
    above the limit is refused here, where the hook would fail the container."""
    request = limits.soft_bytes // MIB
    limit = limits.hard_bytes // MIB
    if limits.soft_bytes < 0 or limits.hard_bytes < 0:
        raise CapsRequestError(f"negative memory limits: {limits}")
    if request > limit:
        raise CapsRequestError(
            f"memory request {request} MiB is above the limit {limit} MiB; the hook would "
            "refuse the container"
        )
    return {"NVIDIA_GPU_MEMORY_REQUEST": str(request), "NVIDIA_GPU_MEMORY_LIMIT": str(limit)}


HOOK_NAME = "apply-cuda-memory-limits"
DEFAULT_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
"""Where the NVIDIA Container Toolkit installs `nvidia-cdi-hook` (its CDI specs' default)."""
HOOK_LIFECYCLE = "createRuntime"
"""The OCI stage the toolkit gives this hook (`getOCIHookType`: create-runtime, after the
container's cgroup exists and before its process runs), not createContainer."""


def hook_entry(
    hook_path: str, gpu_uuids: Iterable[str], driver_root: str = ""
) -> dict[str, object]:
    """One CDI hook entry running `apply-cuda-memory-limits` for `gpu_uuids`. Its arguments
    follow the toolkit's own specs: `argv[0]` is the binary's name, `nvidia-ctk` takes
    `hook` before the subcommand, and the flags are `--driver-root` then one `--gpu-id` per
    GPU."""
    base = hook_path.rstrip("/").rsplit("/", 1)[-1]
    args = [base, "hook", HOOK_NAME] if base == "nvidia-ctk" else [base, HOOK_NAME]
    args += ["--driver-root", driver_root]
    for uuid in gpu_uuids:
        args += ["--gpu-id", uuid]
    return {"hookName": HOOK_LIFECYCLE, "path": hook_path, "args": args}


@dataclass(frozen=True, slots=True)
class CapTarget:
    """Limits the agent wants on one cgroup of one GPU."""

    cgroup_path: str
    """Full sysfs path (`/sys/fs/cgroup/kubepods.slice/...`), NVML's `nameSpace`."""
    gpu_uuid: str
    limits: MemoryLimits
    container: str = ""
    """`namespace/pod/container`, for logs and metrics."""


CheckOutcome = Literal["ok", "set", "repaired", "raised"]


def check_outcome(wanted: MemoryLimits, read: MemoryLimits | None) -> CheckOutcome:
    """What the agent does after reading a cgroup's limits back: nothing when they match,
    `set` when none were there (the first apply), `repaired` when a different one was (a
    hook gave the last claim's limits to every GPU), `raised` when one above gpuslice's was:
    the tenant chose its own (its pod's `NVIDIA_GPU_MEMORY_LIMIT` wins over Allocate's in
    the container's env, and the toolkit's hook applies it) or someone with root lifted it.
    Each but `ok` is set to `wanted` again; `raised` is also told, as a tenant's doing."""
    if read is not None and read.same_limits(wanted):
        return "ok"
    if read is None or read.cleared:
        return "set"
    if read.hard_bytes > wanted.hard_bytes or read.soft_bytes > wanted.soft_bytes:
        return "raised"
    return "repaired"


# -- the agent's side: which containers want which limits, where their cgroup is --------


def wanted_limits(
    assignments: Iterable[Assignment],
    plan: Plan,
    capabilities: Mapping[str, GpuCapability],
    policy: CapPolicy,
) -> dict[tuple[ContainerKey, str], MemoryLimits]:
    """(container, GPU UUID) -> the limits it should have, for every container the kubelet
    lists (PodResources) as holding devices of the plan on a capable GPU.

    A container's devices on one GPU add up (two replicas: twice the share), as the guard
    counts them (`core.attribution`); one that also holds an MPS, MIG or whole-GPU device
    there gets no cap on that GPU (its other device's limit is not gpuslice's to set)."""
    devices: dict[str, AdvertisedDevice] = {}
    for resource in plan.resources:
        for dev in resource.devices:
            devices[f"{resource.name}\0{dev.id}"] = dev
    held: dict[tuple[ContainerKey, str], list[AdvertisedDevice]] = {}
    for a in assignments:
        key = ContainerKey(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            found = devices.get(f"{a.resource}\0{device_id}")
            if found is not None:
                held.setdefault((key, found.physical.gpu_uuid), []).append(found)
    out: dict[tuple[ContainerKey, str], MemoryLimits] = {}
    for (key, gpu), devs in sorted(held.items()):
        capability = capabilities.get(gpu)
        if capability is None or not capability.capable:
            continue
        if any(d.physical.kind != "gpu" for d in devs):
            continue
        entitlements = [entitlement_of(d, None) for d in dict.fromkeys(devs)]
        if any(e.kind != "time-slicing" for e in entitlements):
            continue
        total = devs[0].physical.memory_mib * MIB
        memory = sum(e.memory_bytes for e in entitlements)
        limits = limits_for(Entitlement("time-slicing", memory, None), total, policy)
        if limits is not None:
            out[(key, gpu)] = limits
    return out


def cgroup_candidates(pod_uid: str, container_id: str) -> list[str]:
    """Where the kubelet puts a container's cgroup v2, relative to the cgroup root, for
    each QoS class and cgroup driver (the forms `core.cgroups` reads back): the systemd
    driver's `kubepods[-qos]-pod<uid_>.slice/<runtime>-<id>.scope` and the cgroupfs
    driver's `kubepods[/qos]/pod<uid>/<id>`. The adapter takes the first that exists."""
    under = pod_uid.replace("-", "_")
    out: list[str] = []
    for top in ("kubepods.slice", "kubelet.slice/kubelet-kubepods.slice"):
        prefix = "kubelet-kubepods" if top.startswith("kubelet.slice") else "kubepods"
        for qos in ("", "burstable", "besteffort"):
            qos_dir = f"/{prefix}-{qos}.slice" if qos else ""
            pod_dir = f"{prefix}{'-' + qos if qos else ''}-pod{under}.slice"
            for scope in ("cri-containerd", "crio", "docker"):
                out.append(f"{top}{qos_dir}/{pod_dir}/{scope}-{container_id}.scope")
    for qos in ("", "burstable/", "besteffort/"):
        out.append(f"kubepods/{qos}pod{pod_uid}/{container_id}")
    return out


def guarded(tenants: Iterable[Tenant], capped: Set[tuple[ContainerKey, str]]) -> list[Tenant]:
    """The tenants the guard still watches: all but those the driver caps on that GPU. On a
    GPU whose every tenant is capped nobody is signalled for memory; an overrun there fails
    the overrunner's own allocation."""
    return [t for t in tenants if (t.key, t.gpu_uuid) not in capped]


@dataclass(frozen=True, slots=True)
class CapsView:
    """What the metrics, `describe` and `top` show of caps: the protection of each GPU (with
    the reason it is not capped) and each capped container's limits as last read back."""

    protection: Mapping[str, tuple[Protection, str]]
    """GPU UUID -> (protection, why not capped: "" when capped)."""
    limits: Mapping[tuple[ContainerKey, str], MemoryLimits]
    windows_s: tuple[float, ...] = ()
    """Cgroup creation -> limits confirmed, per container and GPU the agent applied."""


def caps_view(
    capabilities: Mapping[str, GpuCapability],
    guard_mode: str,
    limits: Mapping[tuple[ContainerKey, str], MemoryLimits],
    windows_s: Iterable[float] = (),
) -> CapsView:
    return CapsView(
        protection={
            uuid: (protection(cap, guard_mode), cap.reason)
            for uuid, cap in sorted(capabilities.items())
        },
        limits=dict(limits),
        windows_s=tuple(windows_s),
    )
