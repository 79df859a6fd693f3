"""Seed 001 replayed with the memory guard: ten time-sliced pods on one L40S, one leaking.

Seed 001 ran `stress.py` pods (3.7 GiB each) on an L40S with time-slicing and found that
"the last applications to start talking to the GPU will be the first ones to crash". Here
nine pods start two seconds apart; `stress-2` leaks 200 MiB/s; the tenth pod starts at
t=50 s. With the guard off the tenth pod dies of CUDA out-of-memory, though it asks for
less than its share; with the guard enforcing, `stress-2` is stopped once its growth would
take free memory below the reserve before the guard could act again, and every other pod
keeps running.

The GPU, the plan and the shares are the real ones (`sim:1xl40s`, a time-slicing config
with 10 replicas); memory and time are simulated (`demo.guardsim`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.agent.plan import plan_node
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.backends.simulated.memory import Allocation
from gpuslice.core.config import parse_config
from gpuslice.core.guard import GuardParams
from gpuslice.demo.guardsim import SimPod, SimResult, outcomes

NODE = "sim:1xl40s"
REPLICAS = 10
CONFIG = f"""\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {REPLICAS}
"""
STRESS_MIB = 3800
"""What seed 001's stress.py held: 3.71 GiB."""
LEAK_MIB_S = 200.0
LEAKER = "stress-2"
LAST = "stress-9"
LAST_START_S = 50.0
UNTIL_S = 60.0


@dataclass(frozen=True, slots=True)
class GuardDemo:
    gpu: str
    total_mib: int
    share_mib: int
    params: GuardParams
    interval_s: float
    pods: tuple[SimPod, ...]
    off: SimResult
    enforce: SimResult
    caps: SimResult
    """The driver's caps (r615+, strict: soft = hard = the share), the guard stepped back."""


def pods() -> tuple[SimPod, ...]:
    out = []
    for i in range(REPLICAS):
        name = f"stress-{i}"
        start = LAST_START_S if name == LAST else 2.0 * i
        if name == LEAKER:
            leak = Allocation(start_mib=STRESS_MIB, rate_mib_s=LEAK_MIB_S)
            out.append(SimPod(name, leak, start, well_behaved=False))
        else:
            out.append(SimPod(name, Allocation(start_mib=STRESS_MIB), start))
    return tuple(out)


def run_guard_demo(interval_s: float = 1.0) -> GuardDemo:
    backend = open_backend(NODE)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    plan = plan_node(inventory, parse_config(CONFIG), AgentSettings(node=NODE))
    [resource] = plan.resources
    device = resource.devices[0]
    total = device.physical.memory_mib
    story = pods()
    told = outcomes(total, device.replicas, story, interval_s=interval_s, until_s=UNTIL_S)
    return GuardDemo(
        gpu=inventory.gpus[0].product_name,
        total_mib=total,
        share_mib=total // device.replicas,
        params=told.params,
        interval_s=interval_s,
        pods=story,
        off=told.nothing,
        enforce=told.guard,
        caps=told.caps,
    )
