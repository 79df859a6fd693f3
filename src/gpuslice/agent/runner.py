"""The node agent: the one place that joins the core to every adapter.

One `asyncio.TaskGroup` supervises the loops (device plugin servers, health, config reload,
labels, MPS daemons, metrics); one stop event ends them all. The plan in force only ever
changes through `_apply`, which validates first: a bad config or a plan that does not fit
the node is logged (and posted as a Kubernetes Event when the API is reachable) and the
previous plan stays advertised, so nothing already allocated disappears.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from gpuslice.agent.configs import LoadedConfig, current_fingerprint, load_config
from gpuslice.agent.settings import AgentSettings
from gpuslice.core.devices import Inventory
from gpuslice.core.errors import GpusliceError
from gpuslice.core.health import HealthPolicy, HealthState
from gpuslice.core.sharing.model import Plan
from gpuslice.core.sharing.plan import build_plan
from gpuslice.kubelet.manager import DevicePluginManager
from gpuslice.kubelet.servicer import AllocateObserver
from gpuslice.kubelet.state import PlanState
from gpuslice.kubelet.waiting import unless_stopped
from gpuslice.ports import GpuBackend

log = logging.getLogger("gpuslice.agent")

ConfigListener = Callable[[str, bool, str], Awaitable[None]]
"""Called after each reload attempt with (config name, accepted, message)."""


@dataclass(slots=True)
class AgentHooks:
    """Optional adapters the agent drives when present (wired by `agent.build`)."""

    on_config: list[ConfigListener] = field(default_factory=list)
    on_plan: list[Callable[[Plan, Inventory], Awaitable[None]]] = field(default_factory=list)
    """Called with each plan put in force (the first one too): labels, MPS daemons."""
    on_allocate: AllocateObserver | None = None
    """Told (resource, succeeded, seconds) after every Allocate (the metrics counters)."""
    on_health: list[Callable[[str, bool], None]] = field(default_factory=list)
    """Called with (physical UUID, healthy) on every health transition."""
    services: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = field(
        default_factory=list
    )
    """Long-running loops supervised with the agent's own (metrics, MPS, label watch)."""


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        backend: GpuBackend,
        *,
        hooks: AgentHooks | None = None,
        label_values: asyncio.Queue[str] | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.hooks = hooks or AgentHooks()
        self.label_values = label_values
        """Values of the node's config label, pushed by the Kubernetes watcher."""
        self.policy, policy_warnings = HealthPolicy.from_env(
            settings.disable_healthchecks, settings.enable_healthchecks
        )
        for w in policy_warnings:
            log.warning("event=healthcheck-setting message=%r", w)
        self.health = HealthState()
        self.extra_unhealthy: frozenset[str] = frozenset()
        """Physical UUIDs withdrawn for reasons other than XIDs (an MPS daemon that is down)."""
        self.label_value = ""
        self.loaded: LoadedConfig | None = None
        self.state: PlanState | None = None
        self.started = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def initial_plan(self) -> tuple[Plan, Inventory, LoadedConfig]:
        """First plan: here a bad config is fatal (there is nothing in force to keep)."""
        inventory = await asyncio.to_thread(self.backend.inventory)
        loaded = load_config(self.settings, self.label_value)
        plan = build_plan(inventory, loaded.config)
        return plan, inventory, loaded

    async def run(self, stop: asyncio.Event) -> None:
        if self.label_values is not None:
            try:
                self.label_value = await asyncio.wait_for(
                    self.label_values.get(), self.settings.initial_label_wait_s
                )
            except TimeoutError:
                log.warning(
                    "event=node-label-unknown label=%s waited_s=%s: planning without it",
                    self.settings.node_label,
                    self.settings.initial_label_wait_s,
                )
        plan, inventory, loaded = await self.initial_plan()
        self.loaded = loaded
        self.state = PlanState(plan, inventory)
        self._log_plan(plan, loaded.name)
        for w in plan.warnings:
            log.warning("event=plan-warning message=%r", w)
        for hook in self.hooks.on_plan:
            await hook(plan, inventory)
        manager = DevicePluginManager(
            self.state,
            plugin_dir=self.settings.plugin_dir,
            kubelet_socket=self.settings.kubelet_socket,
            on_allocate=self.hooks.on_allocate,
        )
        async with asyncio.TaskGroup() as tg:
            tg.create_task(manager.run(stop), name="device-plugins")
            tg.create_task(self._health_loop(stop), name="health")
            tg.create_task(self._reload_loop(stop), name="config-reload")
            for service in self.hooks.services:
                tg.create_task(service(stop), name=getattr(service, "__name__", "service"))
            self.started.set()
            await stop.wait()

    # -- plan changes ----------------------------------------------------------------------

    async def reload(self, reason: str) -> bool:
        """Re-read the config (and the inventory) and apply it if valid. Returns accepted."""
        assert self.state is not None
        try:
            inventory = await asyncio.to_thread(self.backend.inventory)
            loaded = load_config(self.settings, self.label_value)
            plan = build_plan(inventory, loaded.config)
        except GpusliceError as exc:
            name = self.label_value or self.settings.config_name or "(default)"
            log.error("event=config-rejected reason=%s config=%s error=%r", reason, name, str(exc))
            await self._notify(name, False, str(exc))
            return False
        self.loaded = loaded
        snapshot = self.state.current
        if plan == snapshot.plan and inventory == snapshot.inventory:
            return True
        self.state.publish(plan=plan, inventory=inventory, unhealthy=self._unhealthy())
        self._log_plan(plan, loaded.name)
        for hook in self.hooks.on_plan:
            await hook(plan, inventory)
        counts = ", ".join(f"{k}={v}" for k, v in sorted(plan.counts().items())) or "none"
        await self._notify(
            loaded.name, True, f"applied config {loaded.name or '(single)'}: {counts}"
        )
        return True

    async def _notify(self, name: str, accepted: bool, message: str) -> None:
        for listener in self.hooks.on_config:
            try:
                await listener(name, accepted, message)
            except Exception:
                # a listener (e.g. the Events API being down) must not stop reloads
                log.exception("event=config-listener-failed")

    async def _reload_loop(self, stop: asyncio.Event) -> None:
        assert self.loaded is not None
        fingerprint = self.loaded.fingerprint
        while not stop.is_set():
            label_changed = await self._wait_label_or_tick(stop)
            if stop.is_set():
                return
            new_fp = await asyncio.to_thread(current_fingerprint, self.settings)
            if label_changed:
                await self.reload("node-label")
                fingerprint = new_fp
            elif new_fp != fingerprint and new_fp:
                fingerprint = new_fp
                await self.reload("config-file")

    async def _wait_label_or_tick(self, stop: asyncio.Event) -> bool:
        """Sleep one reload interval, or less if the node's config label changes."""
        if self.label_values is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.reload_interval_s)
            return False
        try:
            value = await asyncio.wait_for(self.label_values.get(), self.settings.reload_interval_s)
        except TimeoutError:
            return False
        if value == self.label_value:
            return False
        log.info("event=node-label-changed label=%s value=%r", self.settings.node_label, value)
        self.label_value = value
        return True

    # -- health ----------------------------------------------------------------------------

    def _unhealthy(self) -> frozenset[str]:
        return self.health.unhealthy | self.extra_unhealthy

    def set_withdrawn(self, uuids: frozenset[str]) -> None:
        """Mark physical devices unhealthy for a non-XID reason (e.g. MPS daemon down)."""
        assert self.state is not None
        if uuids == self.extra_unhealthy:
            return
        self.extra_unhealthy = uuids
        self.state.publish(unhealthy=self._unhealthy())

    async def _health_loop(self, stop: asyncio.Event) -> None:
        assert self.state is not None
        while not stop.is_set():
            # The loop leaves at once on stop; the thread still waiting is woken when the
            # backend is closed, so the wait can be long and the idle daemon stays asleep.
            event = await unless_stopped(
                stop,
                asyncio.to_thread(self.backend.wait_health_event, self.settings.health_poll_s),
            )
            if event is None:
                continue
            inventory = self.state.current.inventory
            before = self.health.unhealthy
            self.health = self.health.apply(event, inventory, self.policy)
            if self.health.unhealthy == before:
                log.info(
                    "event=health-ignored kind=%s gpu=%s xid=%s",
                    event.kind,
                    event.gpu_uuid,
                    event.xid,
                )
                continue
            log.warning(
                "event=health-changed kind=%s gpu=%s xid=%s unhealthy=%s",
                event.kind,
                event.gpu_uuid,
                event.xid,
                ",".join(sorted(self.health.unhealthy)) or "-",
            )
            self.state.publish(unhealthy=self._unhealthy())
            for uuid in self.health.unhealthy ^ before:
                for on_health in self.hooks.on_health:
                    on_health(uuid, uuid not in self.health.unhealthy)

    # -- logging ---------------------------------------------------------------------------

    @staticmethod
    def _log_plan(plan: Plan, name: str) -> None:
        counts = " ".join(f"{k}={v}" for k, v in sorted(plan.counts().items())) or "none"
        log.info(
            "event=plan config=%s mig_strategy=%s resources=%s",
            name or "-",
            plan.mig_strategy,
            counts,
        )
