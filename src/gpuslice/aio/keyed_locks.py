"""One asyncio lock per key (a claim UID, a GPU UUID), created on first use and dropped
when nobody holds or waits for it.

The DRA driver serializes only what must be: work on one claim, and work that touches one
GPU. A single lock for everything made an unrelated claim wait behind a slow MPS start.
Several keys are always taken in sorted order, so two holders of overlapping sets never
wait on each other in a cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    """Holders and waiters: the entry goes once this drops to zero."""


class KeyedLocks:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """Keys currently held or waited for (tests read it to see nothing is left over)."""
        return len(self._entries)

    def held(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.lock.locked()

    @contextlib.asynccontextmanager
    async def holding(self, keys: Iterable[str]) -> AsyncIterator[None]:
        """Hold every lock of `keys` (duplicates ignored) for the body."""
        ordered = sorted(set(keys))
        entries = [self._entries.setdefault(k, _Entry()) for k in ordered]
        for entry in entries:
            entry.users += 1
        taken: list[_Entry] = []
        try:
            for entry in entries:
                await entry.lock.acquire()
                taken.append(entry)
            yield
        finally:
            for entry in reversed(taken):
                entry.lock.release()
            for key, entry in zip(ordered, entries, strict=True):
                entry.users -= 1
                if entry.users == 0:
                    del self._entries[key]
