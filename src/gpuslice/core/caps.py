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
this module decides, per GPU, which protection it gets (`protection`), and per device, which
limits (`limits_for`; who holds what, and the limits of each container: `core.protection`);
the adapters apply them (the toolkit's CDI hook before the container runs, given its work
by `core.cdi.hook`, or the agent right after) and the guard steps back on the GPUs that are
capped.

What is *not* documented, and so not assumed here: how the driver honours a soft limit (the
simulator reads it as memory held back for that cgroup, `core.gpumemory`), what a hard
limit set below the memory a cgroup already holds does to that memory, and how caps
interact with MPS (an MPS client's memory is allocated through the MPS server; which
cgroup the driver charges is not said). So MPS tenants keep only their pinned limit, which
the MPS server enforces, and get no cap from gpuslice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gpuslice.core.attribution import Entitlement
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB, whole_mib

if TYPE_CHECKING:
    from gpuslice.core.cdi.hook import CdiCaps  # which builds on MemoryLimits, below

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
"""What holds a GPU's tenants to their memory: the driver (`capped`: limits confirmed by
reading them back), the memory guard (`guarded`: only when it enforces; a guard that
observes stops nobody, so the bench loses as many pods under it as with none), or
nothing."""

Refusal = Literal[
    "caps-off",
    "mig",
    "unified-memory",
    "driver-without-call",
    "cgroup-v1",
    "not-root",
    "no-pod-cgroups",
    "nvml-error",
]
"""Why a GPU is not capped: caps turned off; a MIG GPU (NVML refuses MIG handles); a
unified-memory GPU (no memory figure to split); a driver older than r615 (the function is
missing); a node on cgroup v1 (the toolkit's hook fails there, and the limits are keyed by a
cgroup v2 path); an agent that is not root; no pod's cgroup under `--cgroup-root` (the
agent sees its own cgroup namespace, not the host's tree); NVML failed the call."""

REFUSAL_TEXT: Mapping[Refusal, str] = {
    "caps-off": "memory caps are turned off (--memory-caps off)",
    "mig": "MIG mode: NVML does not set memory limits on MIG devices",
    "unified-memory": "unified memory: NVML reports no GPU memory to split",
    "driver-without-call": "the driver has no nvmlDeviceSetMemoryLimits_v1 (needs r615+)",
    "cgroup-v1": "the node runs cgroup v1; memory limits need cgroup v2",
    "not-root": "the agent is not root with CAP_SYS_ADMIN; setting memory limits needs it",
    "no-pod-cgroups": "pods' cgroups not found under --cgroup-root (mount the host's "
    "/sys/fs/cgroup there)",
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
    pod_cgroups: bool = True
    """The kubelet's pod cgroups (`kubepods`) are under the cgroup root: false where the
    root is the agent's own cgroup namespace, which holds no other pod."""

    def refusal(self) -> Refusal | None:
        if not self.cgroup_v2:
            return "cgroup-v1"
        if not self.root:
            return "not-root"
        if not self.pod_cgroups:
            return "no-pod-cgroups"
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


@dataclass(frozen=True, slots=True)
class ContainerCaps:
    """What a front end hands containers of memory caps, whichever front end it is: each
    GPU's capability, the policy, and how to call the toolkit's hook (None: the agent
    applies the limits after the container starts). Both are asked at each use (Prepare,
    Allocate), so what changes while the agent runs is seen: a hook program installed or
    removed (`agent.caps.HookProgram.cdi`), a GPU refused or failing NVML since start
    (`agent.caps.CapsApplier.hook_capabilities`)."""

    capabilities: Callable[[], Mapping[str, GpuCapability]]
    policy: CapPolicy
    hook: Callable[[], CdiCaps | None]

    def gpus(self) -> Mapping[str, GpuCapability]:
        """Each GPU's capability now."""
        return self.capabilities()

    def hook_now(self) -> CdiCaps | None:
        """The hook as a spec may name it now."""
        return self.hook()


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
    """What would hold a GPU's tenants to their share on its capability alone (`describe`,
    which runs no caps loop): the driver where it can, else the guard where it enforces,
    else nothing. The agent reports `gpu_protection` instead, which also asks whether
    the limits were confirmed."""
    if capability is not None and capability.capable:
        return "capped"
    return uncapped(guard_mode)


def uncapped(guard_mode: str) -> Protection:
    """The protection of a GPU the driver does not hold: the guard only where it enforces.
    An observing guard reports and stops nobody (issue 40: the bench loses 3.8 % of pods
    under observe, as with no guard), so it protects nothing."""
    return "guarded" if guard_mode == "enforce" else "none"


def cappable(kind: SharingStrategy, whole_gpu: bool, device_bytes: int) -> bool:
    """Whether the driver may cap a holder at all, whatever its GPU allows: only a
    time-sliced holder of a whole GPU whose memory NVML reports. An exclusive holder has
    nobody to protect, a MIG device has its own memory (and NVML refuses MIG handles), an
    MPS client keeps the pinned limit its server enforces (the module docstring). A fact of
    the plan for a replica (`core.policy.DeviceEntitlement.cappable`, which Allocate reads)
    and of the claim for a DRA holder (`core.protection`)."""
    return kind is SharingStrategy.TIME_SLICING and whole_gpu and device_bytes > 0


def limits_for(
    entitlement: Entitlement, gpu_total_bytes: int, policy: CapPolicy
) -> MemoryLimits | None:
    """The limits of one tenant on one GPU, None for a tenant that gets no cap.

    Only time-sliced tenants (replicas, DRA shares not under MPS, claims shared by pods) are
    capped: an exclusive holder has nobody to protect, a MIG device has its own memory, and
    an MPS client keeps the pinned limit its MPS server enforces (see the module docstring).
    soft = the entitlement the guard already computes; hard by `policy`."""
    if entitlement.kind is not SharingStrategy.TIME_SLICING or gpu_total_bytes <= 0:
        return None
    soft = whole_mib(max(0, min(entitlement.memory_bytes, gpu_total_bytes)))
    hard = soft if policy == "strict" else whole_mib(gpu_total_bytes)
    return MemoryLimits(soft, hard)


CheckOutcome = Literal["ok", "set", "repaired", "raised"]


def check_outcome(
    wanted: MemoryLimits, read: MemoryLimits | None, last_set: MemoryLimits | None = None
) -> CheckOutcome:
    """What the agent does after reading a cgroup's limits back: nothing when they match,
    `set` when none were there (the first apply), `repaired` when a different one was (a
    hook gave the last claim's limits to every GPU, or the container's share changed since
    gpuslice set `last_set`), `raised` when one above gpuslice's was and gpuslice did not set
    it: the tenant chose its own (where Allocate carries no pair, the pod's own
    `NVIDIA_GPU_MEMORY_LIMIT` reaches the toolkit's hook) or someone with root lifted it.
    Each but `ok` is set to `wanted` again; `raised` is also told, as a tenant's doing."""
    if read is not None and read.same_limits(wanted):
        return "ok"
    if read is None or read.cleared:
        return "set"
    if last_set is not None and read.same_limits(last_set):
        return "repaired"
    if read.hard_bytes > wanted.hard_bytes or read.soft_bytes > wanted.soft_bytes:
        return "raised"
    return "repaired"


# -- the agent's side: where a container's cgroup is --------------------------------------
# (which containers want which limits: `core.protection`)


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


@dataclass(frozen=True, slots=True)
class CapsView:
    """What the metrics, `/status`, `describe` and `top` show of caps: the protection of
    each GPU (with the reason it is not capped), each capped container's limits as last
    read back, and why each container that should be capped is not (yet)."""

    protection: Mapping[str, tuple[Protection, str]]
    """GPU UUID -> (protection, why not capped: "" when capped)."""
    limits: Mapping[tuple[ContainerKey, str], MemoryLimits]
    windows_s: tuple[float, ...] = ()
    """Cgroup creation -> limits confirmed, per container and GPU the agent applied."""
    pending: Mapping[tuple[ContainerKey, str], str] = field(default_factory=dict)
    """(container, GPU) -> why its limits are not confirmed, for containers that should be
    capped on a capable GPU (cgroup not found, NVML failed and retrying, ...)."""


@dataclass(frozen=True, slots=True)
class GpuCaps:
    """Where the caps loop stands on one GPU: whether it ever confirmed a limit there, and
    why it cannot confirm one now ("" when nothing stands in the way)."""

    confirmed_once: bool = False
    blocked: str = ""


NOT_CONFIRMED_YET = "no container's memory limits confirmed on this GPU yet"


def gpu_protection(
    capability: GpuCapability,
    guard_mode: str,
    state: GpuCaps | None,
    pending: Iterable[str] = (),
) -> tuple[Protection, str]:
    """One GPU's protection as it holds now: `capped` only on a capable GPU whose limits
    the agent has confirmed at least once, with nothing blocking it and no container on it
    still uncapped; otherwise the guard (enforcing) or nothing, and the first reason.

    `state` None asks about the capability alone (`describe`, before any agent ran)."""
    if not capability.capable:
        return uncapped(guard_mode), capability.reason
    if state is None:
        return "capped", ""
    waiting = sorted(set(pending))
    if state.blocked:
        return uncapped(guard_mode), state.blocked
    if waiting:
        more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
        return uncapped(guard_mode), f"a container is not capped: {waiting[0]}{more}"
    if not state.confirmed_once:
        return uncapped(guard_mode), NOT_CONFIRMED_YET
    return "capped", ""


def caps_view(
    capabilities: Mapping[str, GpuCapability],
    guard_mode: str,
    limits: Mapping[tuple[ContainerKey, str], MemoryLimits],
    windows_s: Iterable[float] = (),
    *,
    gpus: Mapping[str, GpuCaps] | None = None,
    pending: Mapping[tuple[ContainerKey, str], str] | None = None,
) -> CapsView:
    """`gpus` None: the capability alone (what `describe` predicts); otherwise each GPU's
    state in the caps loop, a GPU missing from it being one the loop never confirmed."""
    waiting = dict(pending or {})
    per_gpu: dict[str, list[str]] = {}
    for (_, gpu), why in waiting.items():
        per_gpu.setdefault(gpu, []).append(why)
    return CapsView(
        protection={
            uuid: gpu_protection(
                cap,
                guard_mode,
                None if gpus is None else gpus.get(uuid, GpuCaps()),
                per_gpu.get(uuid, ()),
            )
            for uuid, cap in sorted(capabilities.items())
        },
        limits=dict(limits),
        windows_s=tuple(windows_s),
        pending=waiting,
    )
