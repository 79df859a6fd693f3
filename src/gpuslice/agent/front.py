"""The seam between the agent and what serves its plan to the kubelet: a front end.

A node serves its GPUs one way: as device plugins (`DevicePluginFrontEnd`, the default) or
as a DRA driver (`agent.dra_front.DraFrontEnd`). Both read the one `PlanState` the agent
publishes and answer the same questions, so the agent, the metrics, the guard and the
readiness probe never ask which one runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gpuslice.agent.settings import AgentSettings
from gpuslice.core.allocation.caps import AllocateCaps
from gpuslice.core.devices import Inventory
from gpuslice.core.guard.model import ClaimOverride, GuardMode
from gpuslice.core.sharing.model import Plan
from gpuslice.kubelet.manager import DevicePluginManager
from gpuslice.kubelet.servicer import AllocateObserver
from gpuslice.state import PlanState

if TYPE_CHECKING:
    from gpuslice.agent.dra_driver import DraCaps

ModeOf = Callable[[str], GuardMode | None]
"""A resource's own guard mode (DRA: a claim's GuardConfig), None where it has none."""


class FrontEnd(Protocol):
    advises_mig_strategy: bool
    """Whether the plan's advice about `migStrategy` applies (the device plugin's setting;
    DRA publishes MIG devices whatever it says)."""
    on_allocate: AllocateObserver | None
    """Told (resource, succeeded, seconds) after every Allocate (the metrics counters);
    a front end without Allocate (DRA) never calls it."""
    writes_cdi_specs: bool
    """Whether it writes the CDI specs containers get (DRA's claim specs, which then carry
    the toolkit's hook); the device plugin's Allocate names the toolkit's specs instead."""

    async def run(self, stop: asyncio.Event) -> None:
        """Serve the plan state until `stop`."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """(ready, the body of `/readyz`)."""
        ...

    def attributed_plan(self) -> tuple[Plan, Inventory] | None:
        """What attribution, the guard and the exporter read: the plan in force, or in DRA
        mode the prepared claims seen as a plan (one resource per claim)."""
        ...

    def guard_modes(self, node: GuardMode, override: ClaimOverride) -> ModeOf | None:
        """Per-resource guard modes where tenants can set their own (DRA), else None."""
        ...

    def take_caps(self, caps: DraCaps) -> None:
        """The node's memory caps, for what it hands containers from now on: the limits in
        DRA's claim specs, the hook's variables in the device plugin's Allocate."""
        ...


class DevicePluginFrontEnd:
    """One device plugin server per resource of the plan, registered with the kubelet."""

    advises_mig_strategy = True
    writes_cdi_specs = False

    def __init__(
        self,
        state: PlanState,
        settings: AgentSettings,
        *,
        on_allocate: AllocateObserver | None = None,
    ) -> None:
        self._state = state
        self.on_allocate = on_allocate
        """Told (resource, succeeded, seconds) after every Allocate; set by the metrics."""
        self._started = False
        self._caps: DraCaps | None = None
        self.manager = DevicePluginManager(
            state,
            plugin_dir=settings.plugin_dir,
            kubelet_socket=settings.kubelet_socket,
            on_allocate=self._allocated,
            caps=self._allocate_caps,
        )

    def _allocate_caps(self) -> AllocateCaps | None:
        """Asked at each Allocate: the GPUs' capabilities as the caps loop sees them now."""
        caps = self._caps
        return None if caps is None else AllocateCaps(caps.gpus(), caps.policy)

    def _allocated(self, resource: str, ok: bool, seconds: float) -> None:
        if self.on_allocate is not None:
            self.on_allocate(resource, ok, seconds)

    async def run(self, stop: asyncio.Event) -> None:
        self._started = True
        await self.manager.run(stop)

    def readiness(self) -> tuple[bool, str]:
        """Ready once every device plugin is registered with the kubelet."""
        if not self._started:
            return False, "device plugins starting\n"
        registered = self.manager.registered
        wanted = {r.name for r in self._state.current.plan.resources if r.devices}
        waiting = sorted(n for n in wanted | set(registered) if not registered.get(n, False))
        if waiting:
            return False, f"not registered with the kubelet yet: {', '.join(waiting)}\n"
        if not registered:
            return True, "ready: no devices to advertise\n"
        return True, f"ready: registered {', '.join(sorted(registered))}\n"

    def attributed_plan(self) -> tuple[Plan, Inventory] | None:
        snap = self._state.current
        return snap.plan, snap.inventory

    def guard_modes(self, node: GuardMode, override: ClaimOverride) -> ModeOf | None:
        return None

    def take_caps(self, caps: DraCaps) -> None:
        """Allocate gives a capped time-sliced share the toolkit hook's variables where the
        device reaches the container through CDI (`core.allocation.caps`); the caps loop
        checks and repairs them, and applies the limits everywhere else. Read at each
        Allocate, as DRA reads it at each Prepare: a GPU the caps loop refused or backs off
        from since start gets no variables (the hook would fail the pod there)."""
        self._caps = caps
