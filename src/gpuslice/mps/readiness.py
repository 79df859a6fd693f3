"""Which MPS daemons answer right now, as a signal the agent can follow.

A replica of an MPS resource is useless while its daemon is down (clients cannot connect),
so the plugin advertises those replicas Unhealthy until the daemon answers again. The
signal is offered both ways: callbacks for code that reacts at once, and a version
number with `wait_changed` for loops that re-read the whole state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

ReadinessListener = Callable[[str, bool], None]
"""Called with (resource, ready) on every change, from the event loop."""


class Readiness:
    def __init__(self) -> None:
        self._state: dict[str, bool] = {}
        self._version = 0
        self._changed = asyncio.Event()
        self._listeners: list[ReadinessListener] = []

    def add_listener(self, listener: ReadinessListener) -> None:
        self._listeners.append(listener)

    @property
    def version(self) -> int:
        """Bumped on every change; pass it to `wait_changed` to miss none."""
        return self._version

    def ready(self, resource: str) -> bool:
        return self._state.get(resource, False)

    def snapshot(self) -> dict[str, bool]:
        return dict(self._state)

    def set(self, resource: str, ready: bool) -> None:
        if self._state.get(resource) == ready:
            return
        self._state[resource] = ready
        self._bump(resource, ready)

    def forget(self, resource: str) -> None:
        """The resource is no longer served; a listener sees it as not ready."""
        if self._state.pop(resource, False):
            self._bump(resource, False)

    async def wait_changed(self, version: int) -> int:
        """Return the current version once it is newer than `version`."""
        while self._version <= version:
            changed = self._changed
            await changed.wait()
        return self._version

    def _bump(self, resource: str, ready: bool) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for listener in self._listeners:
            listener(resource, ready)
