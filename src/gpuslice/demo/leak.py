"""The default demo's second half: two pods time-slicing one GPU, one of them leaking.

Time-slicing divides a GPU's time, not its memory. With NVIDIA's device plugin a pod that
grows past its share takes memory from its neighbours, and the next allocation to fail is
whichever comes next, usually a well-behaved neighbour's. The story is told three times on
the same pods: nothing between them (NVIDIA's outcome), gpuslice's memory guard (drivers
before r615: the pod over its share is stopped) and the driver's caps gpuslice sets (r615+:
the pod over its share fails its own allocation).

The GPU, its memory and the share come from the plan the demo's agent put in force; the
memory and the clock are simulated (`demo.guardsim`, the simulator's CUDA-like memory model
with the guard's real policy in the loop), so the story is deterministic and takes no time.
The numbers are scaled to the share so that any time-slicing config tells the same story.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.backends.simulated.memory import Allocation
from gpuslice.demo.guardsim import SimPod, SimResult, outcomes

POLL_S = 1.0
"""The guard's poll interval (the agent's default)."""
BURST_EVERY_S = 12.0
"""The neighbour's large batch comes every 12 s and holds its memory for 2 s."""
UNTIL_S = 30.0


@dataclass(frozen=True, slots=True)
class PodMemory:
    """One pod's row of `gpuslice top` (its `/metrics` series: used, entitled, over)."""

    pod: str
    used_mib: int
    share_mib: int
    over_share: bool


@dataclass(frozen=True, slots=True)
class LeakStory:
    gpu: str
    uuid: str
    total_mib: int
    replicas: int
    share_mib: int
    neighbour: str
    leaker: str
    leak_mib_s: float
    pods: tuple[SimPod, ...]
    nvidia: SimResult
    """Nothing between the pods: NVIDIA's device plugin."""
    guard: SimResult
    """gpuslice's memory guard enforcing (its defaults: reserve 10 %, grace 1 s)."""
    caps: SimResult
    """The driver's caps (r615+), soft = hard = the share."""
    seen_at_s: float
    """When the guard acted: the moment `top` is shown at."""
    top: tuple[PodMemory, ...]


def story_pods(share_mib: int, total_mib: int, neighbour: str, leaker: str) -> tuple[SimPod, ...]:
    """The neighbour holds 65 % of its share and takes 30 % more for each batch, never
    over its share; the leaker starts the same and grows so that, left alone, the card is
    nearly full when the neighbour's second batch comes (at 24 s)."""
    base = share_mib * 65 // 100
    burst = share_mib * 30 // 100
    second_batch_s = 2 * BURST_EVERY_S
    rate = (total_mib - 2 * base - burst // 2) / second_batch_s
    steady = Allocation(start_mib=base, burst_mib=burst, burst_every_s=BURST_EVERY_S, burst_s=2.0)
    leak = Allocation(start_mib=base, rate_mib_s=round(rate, 1))
    return (SimPod(neighbour, steady, 0.0), SimPod(leaker, leak, 0.0, well_behaved=False))


def run_leak_story(
    gpu: str, uuid: str, total_mib: int, replicas: int, neighbour: str, leaker: str
) -> LeakStory:
    share = total_mib // replicas
    pods = story_pods(share, total_mib, neighbour, leaker)
    told = outcomes(total_mib, replicas, pods, interval_s=POLL_S, until_s=UNTIL_S)
    guard = told.guard
    acted = [e for e in guard.events if e.what == "reclaim"]
    seen = acted[0].at if acted else UNTIL_S
    held = [(p.name, p.allocation.wanted_mib(seen - p.start_s)) for p in pods]
    top = tuple(PodMemory(name, used, share, used > share) for name, used in held)
    return LeakStory(
        gpu=gpu,
        uuid=uuid,
        total_mib=total_mib,
        replicas=replicas,
        share_mib=share,
        neighbour=neighbour,
        leaker=leaker,
        leak_mib_s=pods[1].allocation.rate_mib_s,
        pods=pods,
        nvidia=told.nothing,
        guard=guard,
        caps=told.caps,
        seen_at_s=seen,
        top=top,
    )
