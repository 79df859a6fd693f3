"""The seam between the agent and what serves its plan to the kubelet: a front end.

A node serves its GPUs one way, chosen by registration (`agent.front_ends.FRONT_ENDS`): as
device plugins (`DevicePluginFrontEnd`, the default) or as a DRA driver
(`agent.dra_front`). Each reads the one `PlanState` the agent publishes and answers the
same questions, offering what it has (its plan warnings, its caps, its holders in
PodResources, its MPS daemons), so the agent, the metrics, the guard and the readiness
probe never ask which one runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.wiring.mps import wire_mps
from gpuslice.core.allocation.caps import AllocateCaps
from gpuslice.core.caps import ContainerCaps
from gpuslice.core.config.schema import Flags
from gpuslice.core.devices import Inventory
from gpuslice.core.guard.model import ClaimOverride, GuardMode
from gpuslice.core.sharing.model import Plan
from gpuslice.kubelet.manager import DevicePluginManager
from gpuslice.kubelet.servicer import AllocateObserver
from gpuslice.mps import MpsDaemonManager, MpsTimings
from gpuslice.podresources import PodResourcesClient
from gpuslice.ports import GpuBackend
from gpuslice.state import PlanState

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from gpuslice.agent.runner import Agent

ModeOf = Callable[[str], GuardMode | None]
"""A resource's own guard mode (DRA: a claim's GuardConfig), None where it has none."""


class FrontEnd(Protocol):
    on_allocate: AllocateObserver | None
    """Told (resource, succeeded, seconds) after every Allocate (the metrics counters);
    a front end without Allocate (DRA) never calls it."""

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

    def plan_warnings(self, plan: Plan) -> tuple[str, ...]:
        """The plan's warnings that say something about what this front end serves."""
        ...

    def take_caps(self, caps: ContainerCaps) -> None:
        """The node's memory caps, for what it hands containers from now on: the limits in
        DRA's claim specs, the hook's variables in the device plugin's Allocate."""
        ...

    def assignments(self, socket: Path) -> PodResourcesClient:
        """The kubelet's PodResources, read for the holders of what this front end serves
        (DRA: the claims of its driver)."""
        ...

    def wire_mps(self, agent: Agent) -> MpsDaemonManager | None:
        """Called once, after the agent exists: the MPS daemons serving this front end's
        shares, with their hooks on the agent where the plan drives them; None where no
        MPS daemon runs."""
        ...


@dataclass(frozen=True, slots=True)
class FrontEndParts:
    """What a front end is built from: the first plan's state and what the agent opened."""

    state: PlanState
    settings: AgentSettings
    backend: GpuBackend
    client: AsyncClient | None
    """The API server, where the settings name the node."""
    warn: Callable[[str, str], Awaitable[None]] | None
    """A Warning Event on the Node, where there is an API server."""
    flags: Flags
    """The first config's flags (where the driver's files are: DRA's base CDI spec)."""


def _no_host_dirs(settings: AgentSettings) -> None:
    """Nothing to check before the node lock: opening the lock file checks its directory."""


@dataclass(frozen=True, slots=True)
class FrontEndKind:
    """One registered way of serving the node (`agent.front_ends.FRONT_ENDS`)."""

    name: str
    """The mode, as the start line and the node lock's holder know it."""
    selected: Callable[[AgentSettings], bool]
    """Whether the settings choose it (its own settings group); the first that does wins."""
    build: Callable[[FrontEndParts], FrontEnd]
    lock_dir: Callable[[AgentSettings], Path]
    """Its own kubelet directory: the one host path every agent of this mode mounts, where
    the node lock lives."""
    check_host_dirs: Callable[[AgentSettings], None] = _no_host_dirs
    """Its host directories checked before they are used, one line naming a directory
    it may not write (`host.hostdirs`)."""


class DevicePluginFrontEnd:
    """One device plugin server per resource of the plan, registered with the kubelet."""

    def __init__(
        self,
        state: PlanState,
        settings: AgentSettings,
        *,
        on_allocate: AllocateObserver | None = None,
    ) -> None:
        self._state = state
        self._settings = settings
        self.on_allocate = on_allocate
        """Told (resource, succeeded, seconds) after every Allocate; set by the metrics."""
        self._started = False
        self._caps: ContainerCaps | None = None
        self.manager = DevicePluginManager(
            state,
            plugin_dir=settings.plugin_dir,
            kubelet_socket=settings.kubelet_socket,
            on_allocate=self._allocated,
            caps=self._allocate_caps,
        )

    def _allocate_caps(self) -> AllocateCaps | None:
        """Asked at each Allocate: the GPUs' capabilities as the caps loop sees them now, and
        the entitlements of the snapshot in force (the servicer reads it in the same step,
        with no await between, so they are those of the devices it allocates)."""
        caps = self._caps
        if caps is None:
            return None
        entitlements = self._state.current.policy.entitlements
        return AllocateCaps(caps.gpus(), caps.policy, entitlements=entitlements)

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

    def plan_warnings(self, plan: Plan) -> tuple[str, ...]:
        """All of them: the advice about `migStrategy` is about this front end's setting."""
        return plan.warnings

    def take_caps(self, caps: ContainerCaps) -> None:
        """Allocate gives a capped time-sliced share the toolkit hook's variables where the
        device reaches the container through CDI (`core.allocation.caps`); the caps loop
        checks and repairs them, and applies the limits everywhere else. Read at each
        Allocate, as DRA reads it at each Prepare: a GPU the caps loop refused or backs off
        from since start gets no variables (the hook would fail the pod there). The hook
        itself is the toolkit's spec's, never named here."""
        self._caps = caps

    def assignments(self, socket: Path) -> PodResourcesClient:
        return PodResourcesClient(socket)

    def wire_mps(self, agent: Agent) -> MpsDaemonManager:
        """The plan's MPS daemons (`agent.wiring.mps`), put in step with every plan."""
        settings = self._settings
        return wire_mps(
            self._state,
            agent.hooks,
            agent.set_withdrawn,
            control=settings.mps_control,
            set_compute_mode=settings.set_compute_mode,
            nvidia_smi=settings.nvidia_smi,
            timings=MpsTimings(health_interval_s=settings.mps_health_interval_s),
            shm_tmpfs=settings.mps_shm_tmpfs,
        )


def _device_plugin(parts: FrontEndParts) -> DevicePluginFrontEnd:
    return DevicePluginFrontEnd(parts.state, parts.settings)


def _always(settings: AgentSettings) -> bool:
    """The default: chosen when no front end registered before it is."""
    return True


def _plugin_dir(settings: AgentSettings) -> Path:
    return settings.plugin_dir


DEVICE_PLUGIN = FrontEndKind(
    name="device-plugin",
    selected=_always,
    build=_device_plugin,
    lock_dir=_plugin_dir,
)
