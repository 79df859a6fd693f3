"""Memory caps for DRA claims: the limits each prepared device's holder gets, and whether
the claim's CDI spec can carry them to the toolkit's hook.

The entitlement is the guard's (`core.attribution.entitlement_of` through the claims plan):
a consumable-capacity share its consumed `memory`, a claim shared by N pods (GuardConfig
`sharedBy`) the device's memory / N; MPS claims keep their pinned limit, MIG devices and
claims holding a whole GPU alone get no cap (`core.caps.limits_for`). A share that reserved
no memory is guaranteed none, and held to what no prepared share on its GPU reserved
(`core.protection`); the agent lowers it as later claims reserve more.

The hook reads one `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` pair from the
container's environment and applies it on every GPU it is given: one pair per container.
So a claim whose capped devices would need different limits gets no hook in its spec (the
agent applies and checks them itself: `core.cdi.hook.hook_env_for`, the rule the device
plugin's Allocate shares), and a container holding two claims with different limits sees
the last one's env (an environment variable does not add up, `core.cdi.spec`): the agent's
check after the container starts repairs the GPU that got the wrong pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuslice.core.attribution import entitlement_of
from gpuslice.core.caps import CapPolicy, GpuCapability, MemoryLimits, limits_for
from gpuslice.core.dra.prepared import DeviceUse
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MpsShare,
    PhysicalDevice,
    SharingStrategy,
)
from gpuslice.core.units import MIB


def use_limits(
    use: DeviceUse,
    physical: PhysicalDevice,
    capability: GpuCapability | None,
    policy: CapPolicy,
    unreserved_bytes: int | None = None,
) -> MemoryLimits | None:
    """The limits of one device's holder, None where it gets no cap: no capability (a MIG
    device, an old driver, a cgroup v1 node...), an admin holder, an untenanted device, a
    share that reserved nothing where what is unreserved on its GPU is not known."""
    if use.admin or capability is None or not capability.capable or physical.kind != "gpu":
        return None
    total = physical.memory_mib * MIB
    if use.entitlement_mib == 0 and use.strategy != SharingStrategy.MPS and total > 0:
        if policy == "borrow":
            return MemoryLimits(0, total)
        if unreserved_bytes is None:
            return None
        return MemoryLimits(0, max(0, min(unreserved_bytes, total)))
    mps = None
    if use.strategy == SharingStrategy.MPS:
        mps = MpsShare(use.thread_percentage or 100, use.entitlement_mib)
    shared = use.shared_by > 1 or use.share_id is not None
    device = AdvertisedDevice(
        id=DeviceId(use.device),
        physical=physical,
        replica=0 if shared else None,
        replicas=max(use.shared_by, 1),
        mps=mps,
        entitlement_mib=use.entitlement_mib,
    )
    return limits_for(entitlement_of(device, None), physical.memory_mib * MIB, policy)


def claim_limits(
    uses: Iterable[DeviceUse],
    physicals: Mapping[str, PhysicalDevice],
    capabilities: Mapping[str, GpuCapability],
    policy: CapPolicy,
    unreserved: Mapping[str, int] | None = None,
) -> dict[str, MemoryLimits]:
    """DRA device name -> its holder's limits, for the capped devices of one claim.
    `unreserved`: GPU UUID -> the memory no other prepared share reserved there."""
    out: dict[str, MemoryLimits] = {}
    for use in uses:
        physical = physicals.get(use.physical_uuid)
        if physical is None:
            continue
        free = None if unreserved is None else unreserved.get(physical.gpu_uuid)
        limits = use_limits(use, physical, capabilities.get(physical.gpu_uuid), policy, free)
        if limits is not None:
            out[use.device] = limits
    return out
