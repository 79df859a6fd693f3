"""GFD's labels of the node, published on every plan put in force and every
`sleepInterval`: to an NFD feature file or straight onto the Node."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
    shutdown as GFD does (NFD then drops the labels).

    A write runs in a worker thread, which a cancelled `publish` (the reload loop cut short
    by shutdown) does not stop: the removal therefore waits for a write in flight, and no
    write starts once it was asked for, so no file is left advertising a node whose agent
    is gone."""

    def __init__(self, target: Callable[[], LabelFile]) -> None:
        """`target`: the file, asked at each write (`flags.gfd.outputFile` follows the
        config in force unless `--labels-file` names one)."""
        self._target = target
        self._lock = threading.Lock()
        self._retracted = False

    def write(self, labels: dict[str, str]) -> None:
        with self._lock:
            if self._retracted:
                return
            file = self._target()
            try:
                if file.write(labels):
                    log.info("labels-written", path=str(file.path), count=len(labels))
            except OSError as exc:  # a read-only host path must not take the device plugin down
                log.error("labels-write-failed", path=str(file.path), error=str(exc))

    def remove(self) -> None:
        with self._lock:
            self._retracted = True
            self._target().remove()

    async def publish(self, labels: dict[str, str]) -> None:
        await asyncio.to_thread(self.write, labels)

    async def retract(self) -> None:
        await asyncio.to_thread(self.remove)


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


@dataclass(frozen=True, slots=True)
class _LabelFileOf:
    """The label file in force: `path` where given, else the config's `gfd.outputFile`, read
    at each write (a reload may move it)."""

    agent: Agent
    path: Path | None

    def __call__(self) -> LabelFile:
        if self.path is not None:
            return LabelFile(self.path)
        return LabelFile(Path(self.agent.loaded.config.flags.gfd.output_file))


def wire_label_file(agent: Agent, path: Path | None) -> None:
    _wire_labels(agent, LabelFileOutput(_LabelFileOf(agent, path)))


def wire_label_api(agent: Agent, labeler: NodeLabeler) -> None:
    _wire_labels(agent, LabelApiOutput(labeler))
