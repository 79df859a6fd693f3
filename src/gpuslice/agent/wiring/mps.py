"""The plan's MPS control daemons, for a front end whose MPS shares come from the plan
(the device plugin's; DRA runs its claims' daemons itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuslice.core.devices import Inventory
from gpuslice.core.mps import mps_specs
from gpuslice.core.sharing.model import Plan, SharingStrategy
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.mps.shm import ShmMounts
from gpuslice.nvsmi import NvidiaSmi
from gpuslice.state import PlanState

if TYPE_CHECKING:
    from gpuslice.agent.runner import AgentHooks


class PlanDaemons:
    """The daemons the plan in force wants, and the replicas withdrawn while theirs is down."""

    def __init__(
        self,
        state: PlanState,
        set_withdrawn: Callable[[frozenset[str]], None],
        *,
        control: tuple[str, ...],
        set_compute_mode: bool,
        nvidia_smi: tuple[str, ...],
        timings: MpsTimings | None,
        shm_tmpfs: bool,
    ) -> None:
        self._state = state
        self._set_withdrawn = set_withdrawn
        self._started = False
        self.manager = MpsDaemonManager(
            [],
            ControlProgram.factory(control),
            compute_mode=NvidiaSmi(nvidia_smi) if set_compute_mode else None,
            timings=timings,
            on_readiness=self.withdraw_down_daemons,
            keep_running=True,  # pods' clients outlive an agent stop, crash or rollout
            shm=ShmMounts() if shm_tmpfs else None,
        )

    def withdraw_down_daemons(self, _resource: str = "", _ready: bool = False) -> None:
        plan = self._state.current.plan
        self._set_withdrawn(
            frozenset(
                dev.physical.uuid
                for res in plan.resources
                if res.strategy == SharingStrategy.MPS and not self.manager.ready(res.name)
                for dev in res.devices
            )
        )

    async def on_plan(self, plan: Plan, _inventory: Inventory) -> None:
        await self.manager.reconfigure(mps_specs(plan))
        if not self._started:  # the first plan, put in force before the front end serves it
            self._started = True
            await self.manager.quit_left_behind(plan.allocate.mps_root)
        self.withdraw_down_daemons()


def wire_mps(
    state: PlanState,
    hooks: AgentHooks,
    set_withdrawn: Callable[[frozenset[str]], None],
    *,
    control: tuple[str, ...],
    set_compute_mode: bool,
    nvidia_smi: tuple[str, ...] = ("nvidia-smi",),
    timings: MpsTimings | None = None,
    shm_tmpfs: bool = False,
) -> MpsDaemonManager:
    """Run an MPS control daemon per MPS resource; its replicas are Unhealthy while it is down.

    NVIDIA's plugin advertises MPS replicas even when no daemon answers, and pods then fail
    with "remote procedural call between the MPS server and the MPS client failed"; here the
    kubelet sees them Unhealthy (not allocatable) until the daemon answers.

    The daemons outlive the agent (as in DRA mode): quitting one cuts every client of every
    pod using it, so a stopping agent leaves them and the next one takes over those started
    with the settings its plan wants. Only a plan without them or with other settings stops
    them: a config reload, or the next agent's first plan (`quit_left_behind`, before the
    front end advertises anything). `shm_tmpfs`: the daemons' shared shm directory is a
    size-limited tmpfs (`mps.shm`).
    """
    daemons = PlanDaemons(
        state,
        set_withdrawn,
        control=control,
        set_compute_mode=set_compute_mode,
        nvidia_smi=nvidia_smi,
        timings=timings,
        shm_tmpfs=shm_tmpfs,
    )
    hooks.on_plan.append(daemons.on_plan)
    hooks.services.append(daemons.manager.run)
    return daemons.manager
