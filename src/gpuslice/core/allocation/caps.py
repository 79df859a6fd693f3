"""Memory caps in Allocate: the toolkit's hook caps a time-sliced container before it runs.

NVIDIA's container toolkit, from v1.20.1, adds the `apply-cuda-memory-limits` hook (OCI stage
`createRuntime`, one per full GPU, never on a MIG device) to the CDI spec it generates for the
device plugin's GPUs (`k8s.device-plugin.nvidia.com/gpu=<UUID>`). The hook reads
`NVIDIA_GPU_MEMORY_REQUEST` (soft) and `NVIDIA_GPU_MEMORY_LIMIT` (hard) in whole MiB from the
container's environment and sets them on every GPU it names, in the container's cgroup,
before the process exists: the window the agent's after-the-fact caps leave (a workload
allocating at its first call) is closed. It also fails the container on cgroup v1, so the
variables are given only where it cannot fail the pod.

So Allocate carries the pair when all of these hold, else nothing (the agent applies the
limits after the container starts, as before, `agent.caps`):

* the device reaches the container through CDI (`cdi-annotations` / `cdi-cri`): only then
  does the toolkit's spec, and its hook, apply;
* every device of the request is a time-sliced replica of a full GPU (never MPS, whose
  server holds the memory, nor MIG, which the hook skips and NVML refuses): a fact of the
  plan, read from the snapshot's table (`core.policy.DeviceEntitlement.cappable`) with the
  replica's entitlement;
* every GPU it lands on is capable (`core.caps.GpuCapability`: cgroup v2, root, a driver
  with the call, not MIG, caps on, no NVML error): the agent finds that and passes it in;
* its GPUs all want the same limits, and limits the hook would not refuse: the hook gives
  one pair to every GPU it names (`core.cdi.hook.hook_env_for`, the rule DRA's claim specs
  share).

A pod's own `NVIDIA_GPU_MEMORY_*` in its spec wins over these (the kubelet puts the device
plugin's env first and the container's after it; containerd keeps the later, measured in
tests/real_node/test_tenant_env_on_a_real_node.py): the agent's read-back then finds a limit
above its share and repairs it (`core.caps.check_outcome`, docs/memory-guard.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuslice.core.caps import CapPolicy, GpuCapability, MemoryLimits
from gpuslice.core.cdi.hook import hook_env_for
from gpuslice.core.policy import DeviceEntitlement
from gpuslice.core.sharing.model import AdvertisedDevice, DeviceListStrategy

CDI_STRATEGIES: frozenset[DeviceListStrategy] = frozenset({"cdi-annotations", "cdi-cri"})


@dataclass(frozen=True, slots=True)
class AllocateCaps:
    """What Allocate needs of memory caps: each GPU's capability as the agent found it (a
    GPU missing here is not capable), the policy that sets the hard limit, and the plan
    snapshot's entitlements (`core.policy.NodePolicy.entitlements`: what each replica holds
    and whether it can be capped at all; a device missing there is not capped)."""

    capabilities: Mapping[str, GpuCapability]
    policy: CapPolicy = "strict"
    entitlements: Mapping[str, DeviceEntitlement] = field(kw_only=True)


def allocation_limits(
    devices: Sequence[AdvertisedDevice], caps: AllocateCaps
) -> dict[str, MemoryLimits] | None:
    """GPU UUID -> the limits of the container holding `devices`, None when any of them is
    not a time-sliced replica of a capable full GPU (`DeviceEntitlement.cappable`).
    Replicas of one GPU add up (two of four hold half of it), as the caps loop counts them
    (`core.protection`)."""
    held: dict[str, tuple[DeviceEntitlement, int]] = {}
    for dev in devices:
        phys = dev.physical
        capability = caps.capabilities.get(phys.gpu_uuid)
        entitlement = caps.entitlements.get(phys.uuid)
        if capability is None or not capability.capable or entitlement is None:
            return None
        if not entitlement.cappable:
            return None
        _, n = held.get(phys.gpu_uuid, (entitlement, 0))
        held[phys.gpu_uuid] = (entitlement, n + 1)
    out: dict[str, MemoryLimits] = {}
    for gpu, (entitlement, n) in held.items():
        limits = entitlement.limits(caps.policy, n)
        if limits is None:
            return None
        out[gpu] = limits
    return out or None


def allocation_caps_env(
    devices: Sequence[AdvertisedDevice],
    strategies: Sequence[DeviceListStrategy],
    caps: AllocateCaps | None,
) -> dict[str, str]:
    """The hook's two variables for one container's Allocate, or nothing where the hook
    would not see them, could fail the pod, or would give a GPU another GPU's limits."""
    if caps is None or not CDI_STRATEGIES.intersection(strategies):
        return {}
    limits = allocation_limits(devices, caps)
    return {} if limits is None else hook_env_for(limits)
