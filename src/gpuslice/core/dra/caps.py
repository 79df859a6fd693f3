"""Memory caps for DRA claims: the limits each prepared device's holder gets, and whether
the claim's CDI spec can carry them to the toolkit's hook.

The entitlement is the guard's (`core.attribution.entitlement_of` through the claims plan):
a consumable-capacity share its consumed `memory`, a claim shared by N pods (GuardConfig
`sharedBy`) the device's memory / N; MPS claims keep their pinned limit, MIG devices and
claims holding a whole GPU alone get no cap (`core.caps.limits_for`).

The hook reads one `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` pair from the
container's environment and applies it on every GPU it is given: one pair per container.
So a claim whose capped devices would need different limits gets no hook in its spec (the
agent applies and checks them itself), and a container holding two claims with different
limits sees the last one's env (an environment variable does not add up, `cdispec`): the
agent's check after the container starts repairs the GPU that got the wrong pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CdiCaps:
    """How the claim specs call the toolkit's hook (`--memory-caps-hook-path`)."""

    hook_path: str
    driver_root: str = ""


def use_limits(
    use: DeviceUse,
    physical: PhysicalDevice,
    capability: GpuCapability | None,
    policy: CapPolicy,
) -> MemoryLimits | None:
    """The limits of one device's holder, None where it gets no cap: no capability (a MIG
    device, an old driver, a cgroup v1 node...), an admin holder, an untenanted device."""
    if use.admin or capability is None or not capability.capable or physical.kind != "gpu":
        return None
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
) -> dict[str, MemoryLimits]:
    """DRA device name -> its holder's limits, for the capped devices of one claim."""
    out: dict[str, MemoryLimits] = {}
    for use in uses:
        physical = physicals.get(use.physical_uuid)
        if physical is None:
            continue
        limits = use_limits(use, physical, capabilities.get(physical.gpu_uuid), policy)
        if limits is not None:
            out[use.device] = limits
    return out


def hook_limits(limits: Mapping[str, MemoryLimits]) -> MemoryLimits | None:
    """The one pair a claim's spec can give the hook, None when its devices need different
    ones (or none): the agent then applies them itself."""
    distinct = set(limits.values())
    return next(iter(distinct)) if len(distinct) == 1 else None
