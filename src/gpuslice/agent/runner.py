"""The node agent: the one place that joins the core to every adapter.

One `asyncio.TaskGroup` supervises the loops (the front end, health, config reload,
labels, MPS daemons, metrics); one stop event ends them all. The plan in force only ever
changes through `_apply`, which validates first: a bad config or a plan that does not fit
the node is logged (and posted as a Kubernetes Event when the API is reachable) and the
previous plan stays advertised, so nothing already allocated disappears.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from gpuslice.agent.config_watch import ConfigWatch
from gpuslice.agent.configs import LoadedConfig, current_fingerprint, load_config
from gpuslice.agent.front import FrontEnd
from gpuslice.agent.plan import plan_node
from gpuslice.agent.settings import AgentSettings
from gpuslice.aio.races import first_of
from gpuslice.aio.waiting import unless_stopped
from gpuslice.core.cordon import CORDON_ANNOTATION, Cordon, parse_cordon
from gpuslice.core.describe import unified_memory_note
from gpuslice.core.devices import Inventory
from gpuslice.core.errors import ConfigError, FieldProblem, GpusliceError
from gpuslice.core.health import HealthEvent, HealthPolicy, HealthState
from gpuslice.core.sharing.model import Plan
from gpuslice.host.devroot import host_dev_root
from gpuslice.logs import get_logger
from gpuslice.ports import GpuBackend
from gpuslice.state import PlanState

log = get_logger("gpuslice.agent")

LOAD_TIMEOUT_S = 30.0
"""Longest a config load (read, parse, plan; in a worker thread) may take before it is
rejected. The loader's own bounds keep a 1 MiB config to about a second; this is the
backstop that keeps a reload from hanging forever on something nobody foresaw."""

Fingerprint = tuple[tuple[str, int, int], ...]

ConfigListener = Callable[[str, bool, str], Awaitable[None]]
"""Called after each reload attempt with (config name, accepted, message)."""


@dataclass(slots=True)
class AgentHooks:
    """Optional adapters the agent drives when present (wired by `agent.build`)."""

    on_config: list[ConfigListener] = field(default_factory=list)
    on_plan: list[Callable[[Plan, Inventory], Awaitable[None]]] = field(default_factory=list)
    """Called with each plan put in force (the first one too): labels, MPS daemons."""
    on_health: list[Callable[[str, bool], None]] = field(default_factory=list)
    """Called with (physical UUID, healthy) on every health transition."""
    on_cordon: list[Callable[[Cordon, Cordon], Awaitable[None]]] = field(default_factory=list)
    """Called with (before, after) when the operator's GPU cordon changes (Events)."""
    services: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = field(
        default_factory=list
    )
    """Long-running loops supervised with the agent's own (metrics, MPS, label watch)."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """One load's result: the config read, the plan built from it and where the host's
    device nodes are for it (computed in the loader's thread: it looks at the disk)."""

    config: LoadedConfig
    plan: Plan
    inventory: Inventory
    host_dev_root: str


@dataclass(frozen=True, slots=True)
class FirstPlan:
    """What `first_plan` found: the plan the agent starts with, and the node label and
    cordon values it was planned for."""

    loaded: Loaded
    label_value: str = ""
    cordon_value: str = ""


def _load_now(settings: AgentSettings, label_value: str, inventory: Inventory) -> Loaded:
    loaded = load_config(settings, label_value)
    flags = loaded.config.flags
    return Loaded(
        loaded,
        plan_node(inventory, loaded.config, settings),
        inventory,
        host_dev_root(flags.plugin.container_driver_root, flags.effective_dev_root),
    )


async def load(settings: AgentSettings, label_value: str, inventory: Inventory) -> Loaded:
    """Read, parse and plan off the event loop, within LOAD_TIMEOUT_S; every failure
    is a ConfigError (the loader promises it; this is the belt to its braces)."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(_load_now, settings, label_value, inventory), LOAD_TIMEOUT_S
        )
    except GpusliceError:
        raise
    except TimeoutError:
        raise ConfigError(
            [FieldProblem("", f"loading the config took more than {LOAD_TIMEOUT_S:g} s")],
            source=str(settings.config_path or ""),
        ) from None
    except Exception as exc:  # a config must never end the daemon
        log.exception("config-load-unexpected")
        raise ConfigError(
            [FieldProblem("", f"cannot load the config ({type(exc).__name__}: {exc})")],
            source=str(settings.config_path or ""),
        ) from None


async def first_plan(
    settings: AgentSettings,
    backend: GpuBackend,
    *,
    label_values: asyncio.Queue[str] | None = None,
    cordon_values: asyncio.Queue[str] | None = None,
) -> FirstPlan:
    """The plan the agent starts with, before anything is wired to it: here a bad config
    is fatal (there is nothing in force to keep). Waits a bounded time for the node's
    config label; the watch delivers the cordon annotation with it."""
    label_value = ""
    if label_values is not None:
        try:
            label_value = await asyncio.wait_for(label_values.get(), settings.initial_label_wait_s)
        except TimeoutError:
            log.warning(
                "node-label-unknown",
                label=settings.node_label,
                waited_s=settings.initial_label_wait_s,
                message="planning without it",
            )
    cordon_value = ""
    while cordon_values is not None and not cordon_values.empty():
        cordon_value = cordon_values.get_nowait()
    inventory = await asyncio.to_thread(backend.inventory)
    for gpu in inventory.gpus:
        if not gpu.memory_reported:  # once, at start: why its memory features are off
            log.warning("gpu-memory-not-reported", gpu=gpu.uuid, note=unified_memory_note(gpu))
    loaded = await load(settings, label_value, inventory)
    return FirstPlan(loaded, label_value, cordon_value)


def plan_state(first: FirstPlan) -> PlanState:
    """The state every front end and adapter reads, holding the first plan."""
    loaded = first.loaded
    return PlanState(loaded.plan, loaded.inventory, host_dev_root=loaded.host_dev_root)


class Agent:
    """Keeps the plan state current (config reloads, health, the operator's cordon) while
    its front end serves it; built around a plan already in force (`first_plan`)."""

    def __init__(
        self,
        settings: AgentSettings,
        backend: GpuBackend,
        state: PlanState,
        first: FirstPlan,
        front_end: FrontEnd,
        *,
        hooks: AgentHooks | None = None,
        label_values: asyncio.Queue[str] | None = None,
        cordon_values: asyncio.Queue[str] | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.state = state
        self.front_end = front_end
        self.hooks = hooks or AgentHooks()
        self.label_values = label_values
        """Values of the node's config label, pushed by the Kubernetes watcher."""
        self.cordon_values = cordon_values
        """Values of the node's `gpuslice.io/gpu-cordon` annotation, from the same watch."""
        self.label_value = first.label_value
        self.cordon_value = first.cordon_value
        self.cordon = Cordon()
        self.policy, policy_warnings = HealthPolicy.from_env(
            settings.disable_healthchecks, settings.enable_healthchecks
        )
        for w in policy_warnings:
            log.warning("healthcheck-setting", message=w)
        self.health = HealthState()
        self.extra_unhealthy: frozenset[str] = frozenset()
        """Physical UUIDs withdrawn for reasons other than XIDs (an MPS daemon that is down)."""
        self._last_xid: dict[str, int | None] = {}
        """GPU UUID -> its last XID (None: lost), published with the unhealthy set."""
        self.loaded = first.loaded.config
        self.unsettled = False
        """The last reload read files that changed under it (see `reload`)."""
        self.started = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        plan = self.state.current.plan
        if self.cordon_value:
            await self._set_cordon(self.cordon_value)
        self._log_plan(plan, self.loaded.name)
        for w in self.front_end.plan_warnings(plan):
            log.warning("plan-warning", message=w)
        for hook in self.hooks.on_plan:
            await hook(plan, self.state.current.inventory)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.front_end.run(stop), name="front-end")
            tg.create_task(self._health_loop(stop), name="health")
            tg.create_task(self._reload_loop(stop), name="config-reload")
            if self.cordon_values is not None:
                tg.create_task(self._cordon_loop(stop), name="gpu-cordon")
            for service in self.hooks.services:
                tg.create_task(service(stop), name=getattr(service, "__name__", "service"))
            self.started.set()
            await stop.wait()

    def readiness(self) -> tuple[bool, str]:
        """The front end's answer (the body of `/readyz`)."""
        return self.front_end.readiness()

    # -- plan changes ----------------------------------------------------------------------

    async def reload(self, reason: str, expect: Fingerprint | None = None) -> bool:
        """Re-read the config (and the inventory) and apply it if valid. Returns accepted.

        With `expect` (the fingerprint the reload loop saw settle), text read from files
        that no longer match it (a writer got in between the check and the read) is
        dropped unapplied and `self.unsettled` is set, so the loop looks again."""
        self.unsettled = False
        try:
            inventory = await asyncio.to_thread(self.backend.inventory)
            result = await load(self.settings, self.label_value, inventory)
            loaded, plan = result.config, result.plan
            if expect is not None and loaded.fingerprint != expect:
                log.info("config-changed-while-read", reason=reason)
                self.unsettled = True
                return False
        except GpusliceError as exc:
            name = self.label_value or self.settings.config_name or "(default)"
            log.error("config-rejected", reason=reason, config=name, error=str(exc))
            await self._notify(name, False, str(exc))
            return False
        except Exception as exc:  # the reload loop must outlive any reload
            name = self.label_value or self.settings.config_name or "(default)"
            log.exception("reload-failed", reason=reason, config=name)
            await self._notify(name, False, f"reload failed: {type(exc).__name__}: {exc}")
            return False
        self.loaded = loaded
        snapshot = self.state.current
        if (plan, inventory, result.host_dev_root) == (
            snapshot.plan,
            snapshot.inventory,
            snapshot.host_dev_root,
        ):
            return True
        self.state.publish(
            plan=plan,
            inventory=inventory,
            unhealthy=self._unhealthy(),
            host_dev_root=result.host_dev_root,
        )
        await self._set_cordon(self.cordon_value)  # indices may name other GPUs now
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
                log.exception("config-listener-failed")

    async def _reload_loop(self, stop: asyncio.Event) -> None:
        """Reload when the config's fingerprint changes and then holds still for one more
        tick: a file caught half-written (a writer that truncates, then writes) is never
        taken as a config. A path that goes missing, dangles or loops changes the
        fingerprint too, so it is rejected (logged, an Event) once, and the plan stays.

        The fingerprint is looked at when inotify says the config's directories changed
        (`agent.config_watch`), every `config_rescan_s` as a safety net, and every
        `reload_interval_s` while a change settles or where nothing can be watched."""
        path = self.settings.config_path
        watch = ConfigWatch(path) if path is not None else None
        try:
            await self._reload_until(stop, watch)
        finally:
            if watch is not None:
                watch.close()

    async def _reload_until(self, stop: asyncio.Event, watch: ConfigWatch | None) -> None:
        fingerprint = self.loaded.fingerprint
        pending: object = None
        while not stop.is_set():
            label_changed = await self._wait_for_change(stop, watch, settling=pending is not None)
            if stop.is_set():
                return
            if watch is not None:
                watch.clear()  # before the look: a change during it wakes the next wait
                watch.rearm()
            new_fp = await asyncio.to_thread(current_fingerprint, self.settings)
            if label_changed:
                await self.reload("node-label")
                fingerprint, pending = new_fp, None
            elif new_fp != fingerprint and new_fp:
                if new_fp != pending:
                    pending = new_fp  # changed: take it once it is the same a tick later
                    continue
                fingerprint, pending = new_fp, None
                await self.reload("config-file", expect=new_fp)
                if self.unsettled:
                    fingerprint = self.loaded.fingerprint  # differs: looked at again

    async def _wait_for_change(
        self, stop: asyncio.Event, watch: ConfigWatch | None, *, settling: bool
    ) -> bool:
        """Sleep until the config may have changed; True when the node's config label did.

        While a change settles, one reload interval (changes in between are what the
        settling waits out). Otherwise until `stop`, the label or a watched directory
        changes, or the safety-net rescan; where the config cannot be watched, one reload
        interval as before. Without a config path only the label can change anything."""
        settings = self.settings
        if settling or (watch is not None and not watch.armed):
            timeout: float | None = settings.reload_interval_s
        elif settings.config_path is None:
            timeout = None
        else:
            timeout = settings.config_rescan_s
        waiters: dict[str, asyncio.Future[Any]] = {"stop": asyncio.ensure_future(stop.wait())}
        if self.label_values is not None:
            waiters["label"] = asyncio.ensure_future(self.label_values.get())
        if watch is not None and not settling:
            waiters["files"] = asyncio.ensure_future(watch.wait())
        await first_of(*waiters.values(), within_s=timeout)
        label = waiters.get("label")
        if label is None or not label.done() or label.cancelled():
            return False
        value = label.result()
        if value == self.label_value:
            return False
        log.info("node-label-changed", label=self.settings.node_label, value=value)
        self.label_value = value
        return True

    # -- health ----------------------------------------------------------------------------

    def _unhealthy(self) -> frozenset[str]:
        return self.health.unhealthy | self.extra_unhealthy

    def _xids(self) -> dict[str, int | None]:
        """A copy for the snapshot: published snapshots never change under their readers."""
        return dict(self._last_xid)

    def set_withdrawn(self, uuids: frozenset[str]) -> None:
        """Mark physical devices unhealthy for a non-XID reason (e.g. MPS daemon down)."""
        if uuids == self.extra_unhealthy:
            return
        self.extra_unhealthy = uuids
        self.state.publish(unhealthy=self._unhealthy())

    async def _health_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # The loop leaves at once on stop; the thread still waiting is woken when the
            # backend is closed, so the wait can be long and the idle daemon stays asleep.
            event = await unless_stopped(
                stop,
                asyncio.to_thread(self.backend.wait_health_event, self.settings.health_poll_s),
            )
            if event is None:
                continue
            if event.kind == "inventory-changed":  # MIG mode or layout changed
                await self.reload("inventory-event")
                continue
            if event.kind in ("unmonitored", "unsupported"):
                self._unmonitored(event)
                continue
            inventory = self.state.current.inventory
            counted = event.kind == "lost" or bool(self.policy.affected(event, inventory))
            if event.kind in ("xid", "lost") and counted:
                # an ignored XID does not replace the one that made the GPU unhealthy
                self._last_xid[event.gpu_uuid] = event.xid if event.kind == "xid" else None
            elif event.kind == "recovered":
                self._last_xid.pop(event.gpu_uuid, None)
            before, noticed = self.health.unhealthy, self.health.noticed
            self.health = self.health.apply(event, inventory, self.policy)
            if self.health.unhealthy == before:
                log.info("health-ignored", kind=event.kind, gpu=event.gpu_uuid, xid=event.xid)
                if self.health.noticed != noticed:  # DRA's informational taints
                    self.state.publish(noticed=self.health.noticed, last_xid=self._xids())
                continue
            log.warning(
                "health-changed",
                kind=event.kind,
                gpu=event.gpu_uuid,
                xid=event.xid,
                unhealthy=",".join(sorted(self.health.unhealthy)) or "-",
            )
            self.state.publish(
                unhealthy=self._unhealthy(), noticed=self.health.noticed, last_xid=self._xids()
            )
            for uuid in self.health.unhealthy ^ before:
                for on_health in self.hooks.on_health:
                    on_health(uuid, uuid not in self.health.unhealthy)

    def _unmonitored(self, event: HealthEvent) -> None:
        """A GPU whose health cannot be watched: published so each front end says so its
        way (`state.Snapshot.unmonitored`), and logged naming the GPU."""
        before = self.health.unmonitored
        self.health = self.health.apply(event, self.state.current.inventory, self.policy)
        if self.health.unmonitored == before:
            log.info("health-unmonitored-ignored", gpu=event.gpu_uuid, reason=event.reason)
            return
        why = self.health.unmonitored[event.gpu_uuid]
        log.warning(
            "health-unmonitored",
            gpu=event.gpu_uuid,
            reason=event.reason,
            message=f"health events of GPU {event.gpu_uuid} are not watched: {event.reason}"
            + ("" if why.in_service else "; its XIDs would go unseen"),
        )
        self.state.publish(unmonitored=self.health.unmonitored)

    # -- the operator's GPU cordon ---------------------------------------------------------

    async def _cordon_loop(self, stop: asyncio.Event) -> None:
        assert self.cordon_values is not None  # started only with a cordon watch
        while not stop.is_set():
            value = await unless_stopped(stop, self.cordon_values.get())
            if value is None:
                continue
            await self._set_cordon(value)

    async def _set_cordon(self, value: str) -> None:
        """Put the annotation's cordon in force on the current inventory; hooks hear of a
        change. A bad entry is skipped (logged and posted), never the end of the loop."""
        self.cordon_value = value
        before = self.cordon
        self.cordon = parse_cordon(value, self.state.current.inventory)
        if self.cordon == before:
            return
        for problem in self.cordon.problems:
            log.warning("gpu-cordon-entry-skipped", message=problem)
        if self.cordon.devices != before.devices:
            log.info(
                "gpu-cordon",
                annotation=CORDON_ANNOTATION,
                cordoned=", ".join(self.cordon.names) or "-",
            )
            self.state.publish(cordoned=self.cordon.devices)
        for hook in self.hooks.on_cordon:
            try:
                await hook(before, self.cordon)
            except Exception:
                log.exception("gpu-cordon-listener-failed")  # Events down: cordon holds

    # -- logging ---------------------------------------------------------------------------

    @staticmethod
    def _log_plan(plan: Plan, name: str) -> None:
        counts = " ".join(f"{k}={v}" for k, v in sorted(plan.counts().items())) or "none"
        log.info("plan", config=name or "-", mig_strategy=plan.mig_strategy, resources=counts)
