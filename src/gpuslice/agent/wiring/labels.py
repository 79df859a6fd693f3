"""GFD's labels of the node, published on every plan put in force and every
`sleepInterval`: to an NFD feature file or straight onto the Node."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuslice.agent.runner import Agent
from gpuslice.core.devices import Inventory
from gpuslice.core.labels import gfd_labels
from gpuslice.core.sharing.model import Plan
from gpuslice.host.labelfile import LabelFile
from gpuslice.logs import get_logger

if TYPE_CHECKING:
    from gpuslice.k8s import NodeLabeler

log = get_logger("gpuslice.agent")


class LabelOutput(Protocol):
    async def publish(self, labels: dict[str, str]) -> None: ...

    async def retract(self) -> None:
        """On shutdown, where the output mode says the labels go with the agent."""
        ...


def _labels_now(agent: Agent) -> dict[str, str]:
    snap = agent.state.current
    no_stamp = agent.settings.no_timestamp or agent.loaded.config.flags.gfd.no_timestamp
    return gfd_labels(
        snap.inventory,
        snap.plan,
        timestamp=None if no_stamp else int(time.time()),
        machine_type=snap.inventory.machine_type,
    )


def _label_interval(agent: Agent) -> float:
    """`flags.gfd.sleepInterval` (60 s by default; "infinite" means only on changes)."""
    interval = agent.loaded.config.flags.gfd.sleep_interval
    return 3600.0 if math.isinf(interval) or interval <= 0 else interval


class LabelPublisher:
    """Publishes on every plan put in force and every `sleepInterval` (the timestamp
    moves), and retracts on shutdown."""

    def __init__(self, agent: Agent, output: LabelOutput) -> None:
        self._agent = agent
        self._output = output

    async def on_plan(self, _plan: Plan, _inventory: Inventory) -> None:
        await self._output.publish(_labels_now(self._agent))

    async def refresh(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _label_interval(self._agent))
                if not stop.is_set():
                    await self._output.publish(_labels_now(self._agent))
        finally:
            await self._output.retract()


def _wire_labels(agent: Agent, output: LabelOutput) -> None:
    labels = LabelPublisher(agent, output)
    agent.hooks.on_plan.append(labels.on_plan)
    agent.hooks.services.append(labels.refresh)


class LabelFileOutput:
    """GFD's classic output: an NFD local feature file, replaced atomically, removed on
    shutdown as GFD does (NFD then drops the labels)."""

    def __init__(self, agent: Agent, path: Path | None) -> None:
        self._agent = agent
        self._path = path

    def target(self) -> Path:
        if self._path is not None:
            return self._path
        return Path(self._agent.loaded.config.flags.gfd.output_file)

    def write(self, labels: dict[str, str]) -> None:
        where = self.target()
        try:
            if LabelFile(where).write(labels):
                log.info("labels-written", path=str(where), count=len(labels))
        except OSError as exc:  # a read-only host path must not take the device plugin down
            log.error("labels-write-failed", path=str(where), error=str(exc))

    async def publish(self, labels: dict[str, str]) -> None:
        await asyncio.to_thread(self.write, labels)

    async def retract(self) -> None:
        await asyncio.to_thread(LabelFile(self.target()).remove)


class LabelApiOutput:
    """The Node's labels patched directly (no NFD needed); only labels we wrote are
    touched."""

    def __init__(self, labeler: NodeLabeler) -> None:
        self._labeler = labeler

    async def publish(self, labels: dict[str, str]) -> None:
        try:
            await self._labeler.apply(labels)
        except Exception:
            # the API server being unreachable must not take the device plugin down
            log.exception("labels-patch-failed")

    async def retract(self) -> None:
        """Nothing: the labels stay on shutdown, where a restarting agent would otherwise
        make them flap."""


def wire_label_file(agent: Agent, path: Path | None) -> None:
    _wire_labels(agent, LabelFileOutput(agent, path))


def wire_label_api(agent: Agent, labeler: NodeLabeler) -> None:
    _wire_labels(agent, LabelApiOutput(labeler))
