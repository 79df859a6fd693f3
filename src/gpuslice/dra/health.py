"""Device health for the kubelet: `v1alpha1.DRAResourceHealth/NodeWatchResources`.

The kubelet (ResourceHealthStatus gate) opens one stream per driver and shows each device's
health in the status of the pods using it. Every response is the complete device list. The
kubelet marks a device Unknown once it has not been refreshed within its
`health_check_timeout_seconds`, so besides a response at once and one on every change, the
list is sent again every `refresh_s` (a third of the timeout by default) with the current
time as `last_updated_time`: health is event-driven here, so "now" is when it was last known.

The health itself comes from a `HealthSource` (the agent's plan state in the daemon), so
this adapter knows nothing of the agent. When the server stops, open streams end with OK
rather than being cut off, and the kubelet reopens them against the next instance.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.races import first_of
from gpuslice.core.dra.health import DeviceHealthReport, health_message
from gpuslice.protos.drahealth.v1alpha1 import api_pb2 as health

DEFAULT_HEALTH_TIMEOUT_S = 30
"""What we tell the kubelet (its own default too): Unknown after this long without news."""
DEFAULT_HEALTH_REFRESH_S = 10.0
"""How often the full list is sent again without a change (well inside the timeout)."""


class HealthSource(Protocol):
    """Where the device health comes from.

    `current()` is (version, complete device list); `wait_newer(version)` returns once the
    version is above `version` (it may return early: the list is then just sent again).
    """

    def current(self) -> tuple[int, Sequence[DeviceHealthReport]]: ...

    async def wait_newer(self, version: int) -> object: ...


def health_response(
    reports: Iterable[DeviceHealthReport], *, now: int, timeout_s: int
) -> health.NodeWatchResourcesResponse:
    return health.NodeWatchResourcesResponse(
        devices=[
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                health=_status(r),
                last_updated_time=now,
                health_check_timeout_seconds=timeout_s,
                message=health_message(r.message),
            )
            for r in reports
        ]
    )


def _status(report: DeviceHealthReport) -> health.HealthStatus:
    if not report.healthy:
        return health.UNHEALTHY
    return health.HEALTHY if report.monitored else health.UNKNOWN


class DraHealthServicer:
    """Serves `NodeWatchResources` from a `HealthSource` until `close()`."""

    def __init__(
        self,
        source: HealthSource,
        *,
        logger: BoundLogger,
        timeout_s: int = DEFAULT_HEALTH_TIMEOUT_S,
        refresh_s: float = DEFAULT_HEALTH_REFRESH_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if timeout_s <= 0 or not 0 < refresh_s <= timeout_s / 2:
            raise ValueError(
                f"health refresh every {refresh_s} s must be positive and at most half the "
                f"timeout ({timeout_s} s), or the kubelet marks devices Unknown between two"
            )
        self._source = source
        self._log = logger
        self._timeout_s = timeout_s
        self._refresh_s = refresh_s
        self._clock = clock
        self._closed = asyncio.Event()
        self.streams = 0
        """Streams open now."""
        self.sent = 0
        """Responses sent, over all streams."""

    def open(self) -> None:
        """Accept streams again after a `close()` (the server started again)."""
        self._closed = asyncio.Event()

    def close(self) -> None:
        """End every open stream with OK; streams opened after this end at once."""
        self._closed.set()

    async def node_watch_resources(
        self, request: health.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        closed = self._closed
        self.streams += 1
        self._log.info("dra-health-stream-opened", streams=self.streams)
        try:
            while not closed.is_set():
                version, reports = self._source.current()
                yield health_response(reports, now=int(self._clock()), timeout_s=self._timeout_s)
                self.sent += 1
                await self._next(version, closed)
        finally:
            self.streams -= 1
            self._log.info("dra-health-stream-closed", streams=self.streams)

    async def _next(self, version: int, closed: asyncio.Event) -> None:
        """Until the health changes, the refresh is due, or the server stops."""
        await first_of(self._source.wait_newer(version), closed.wait(), within_s=self._refresh_s)
