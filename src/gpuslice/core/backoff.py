"""Retry delays, shared by the kubelet registration and the Kubernetes watches.

Pure arithmetic, so it lives in the core where both adapters can use it without importing
each other. Not a retry library (tenacity, backoff): both loops own their waiting, which a
decorator-driven retry would take over: a registration retry is cut short when the kubelet
socket reappears, a watch resets its delays after an event, and both stop with the agent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """`initial_s`, times `factor` after each failure, capped at `maximum_s` (seconds)."""

    initial_s: float = 0.5
    """First retry delay."""
    maximum_s: float = 30.0
    """Longest delay between attempts (NVIDIA's plugin retries every 30 s)."""
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        """Delay after failed attempt number `attempt` (1-based)."""
        return float(min(self.maximum_s, self.initial_s * self.factor ** min(attempt - 1, 60)))

    def delays(self) -> Iterator[float]:
        """The delays in order, forever; start a new iterator to reset."""
        attempt = 1
        while True:
            yield self.delay(attempt)
            attempt += 1
