"""The limits the agent wants are the ones a hook-capped container reads back.

The toolkit's hook takes its limits in whole MiB (`core.cdi.hook.hook_env` rounds down);
the caps loop wants bytes. On a GPU whose memory does not divide by the replicas in whole
MiB (an H100's 81559 MiB in 4 time-sliced replicas), wanting the exact quarter in bytes made
the first read-back of every hook-capped container differ from what the agent wanted: it
was `repaired` (set again and logged as a wrong limit) though the hook had done its job."""

from __future__ import annotations

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.caps import CapPolicy, GpuCapability, MemoryLimits, check_outcome
from gpuslice.core.cdi.hook import hook_env
from gpuslice.core.config import parse_config
from gpuslice.core.protection import node_protection
from gpuslice.core.sharing.plan import build_plan
from gpuslice.core.units import MIB
from gpuslice.ports import ContainerDevices

SLICED = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


def read_back(limits: MemoryLimits) -> MemoryLimits:
    """What the container's cgroup holds once the hook applied the pair it was given."""
    env = hook_env(limits)
    return MemoryLimits(
        int(env["NVIDIA_GPU_MEMORY_REQUEST"]) * MIB, int(env["NVIDIA_GPU_MEMORY_LIMIT"]) * MIB
    )


@pytest.mark.parametrize("policy", ["strict", "borrow"])
@pytest.mark.parametrize(("node", "replicas"), [("sim:1xh100-80gb", 4), ("sim:1xt4", 7)])
def test_a_hook_capped_replica_reads_back_what_the_agent_wants(
    node: str, replicas: int, policy: CapPolicy
) -> None:
    backend = open_backend(node)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    [gpu] = inventory.gpus
    assert gpu.memory_mib % replicas  # the share is no whole number of MiB
    plan = build_plan(inventory, parse_config(SLICED.format(replicas=replicas)))
    [resource] = plan.resources
    held = [
        ContainerDevices("ml", f"p{n}", "main", resource.name, (d.id,))
        for n, d in enumerate(resource.devices)
    ]
    wanted = node_protection(plan, held, policy).limits({gpu.uuid: GpuCapability(gpu.uuid)})
    assert len(wanted) == replicas
    for limits in wanted.values():
        assert check_outcome(limits, read_back(limits)) == "ok", limits
        assert limits.soft_bytes > gpu.memory_mib * MIB // replicas - MIB
