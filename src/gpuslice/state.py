"""The plan in force, as a versioned snapshot that servers and streams wait on.

The agent is the only writer (`publish`); the device plugin servers only read. Every change
bumps the version, so a ListAndWatch stream can tell "nothing new for me" from "resend" by
comparing versions, and the work of building a device list is done once per version rather
than once per stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpuslice.core.devices import Inventory
from gpuslice.core.health import Unmonitored
from gpuslice.core.policy import NodePolicy
from gpuslice.core.sharing.model import Plan


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    plan: Plan
    inventory: Inventory
    policy: NodePolicy
    """The policy per device of `plan` on `inventory` (`core.policy`): built with the
    snapshot, so every reader gets one DRA offer; kept while plan and inventory stay."""
    unhealthy: frozenset[str] = frozenset()
    """Physical UUIDs (GPU or MIG) currently unhealthy."""
    cordoned: frozenset[str] = frozenset()
    """Physical UUIDs the operator cordoned (`core.cordon`): out of service for new work,
    though healthy. The device plugin lists them Unhealthy; DRA taints them."""
    noticed: Mapping[str, int] = field(default_factory=dict)
    """Physical UUID -> the last ignored XID seen on it (DRA's informational taints)."""
    last_xid: Mapping[str, int | None] = field(default_factory=dict)
    """GPU UUID -> the XID that made it unhealthy (None: lost); DRA's taints and health
    stream carry it as NVIDIA's do. Published with the `unhealthy` set it explains."""
    unmonitored: Mapping[str, Unmonitored] = field(default_factory=dict)
    """GPU UUID -> why its health events are not watched (`core.health.Unmonitored`): DRA
    taints it `unmonitored` and reports it Unknown; the device plugin lists it Unhealthy
    unless NVIDIA's keeps it in service (`out_of_service`)."""
    host_dev_root: str = "/"
    """Where the device nodes are on the host for the config in force (`host.devroot`):
    the prefix of the DRA CDI specs' device paths."""

    @property
    def out_of_service(self) -> frozenset[str]:
        """What the device plugin lists Unhealthy: the sick, the cordoned, and the GPUs whose
        health events could not be registered (NVIDIA's device plugin marks them unhealthy:
        an XID on them would never be seen)."""
        unwatched = {u for u, why in self.unmonitored.items() if not why.in_service}
        return self.unhealthy | self.cordoned | unwatched


class PlanState:
    """Holds the current `Snapshot` and wakes everyone waiting for a newer one."""

    def __init__(self, plan: Plan, inventory: Inventory, *, host_dev_root: str = "/") -> None:
        self._current = Snapshot(
            version=1,
            plan=plan,
            inventory=inventory,
            policy=NodePolicy(plan, inventory),
            host_dev_root=host_dev_root,
        )
        self._changed = asyncio.Event()

    @property
    def current(self) -> Snapshot:
        return self._current

    def snapshot(self) -> Snapshot:
        """`current` as a method: what readers that take a snapshot source are handed."""
        return self._current

    def publish(
        self,
        *,
        plan: Plan | None = None,
        inventory: Inventory | None = None,
        unhealthy: frozenset[str] | None = None,
        cordoned: frozenset[str] | None = None,
        noticed: Mapping[str, int] | None = None,
        last_xid: Mapping[str, int | None] | None = None,
        unmonitored: Mapping[str, Unmonitored] | None = None,
        host_dev_root: str | None = None,
    ) -> Snapshot:
        """Replace the given parts; the others are kept. Always bumps the version."""
        old = self._current
        plan = old.plan if plan is None else plan
        inventory = old.inventory if inventory is None else inventory
        same = plan is old.plan and inventory is old.inventory
        self._current = replace(
            old,
            version=old.version + 1,
            plan=plan,
            inventory=inventory,
            policy=old.policy if same else NodePolicy(plan, inventory),
            unhealthy=old.unhealthy if unhealthy is None else unhealthy,
            cordoned=old.cordoned if cordoned is None else cordoned,
            noticed=old.noticed if noticed is None else noticed,
            last_xid=old.last_xid if last_xid is None else last_xid,
            unmonitored=old.unmonitored if unmonitored is None else unmonitored,
            host_dev_root=old.host_dev_root if host_dev_root is None else host_dev_root,
        )
        # One event per version: waiters hold the old one, which stays set forever.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return self._current

    async def wait_newer(self, version: int) -> Snapshot:
        """Return the current snapshot as soon as its version is above `version`."""
        while self._current.version <= version:
            await self._changed.wait()
        return self._current
