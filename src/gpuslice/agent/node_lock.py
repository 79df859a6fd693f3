"""Taking the node before acting on it: the host directories are checked and the node's
lock (`host.nodelock`) is held before anything touches sockets, CDI specs, the checkpoint,
MPS daemons or labels, and is held until the agent has put them all away.

The second agent on a node waits rather than exits: in a rollout the old pod may still be
terminating, and an exit would only turn into a crash loop. While it waits it serves its
probes (alive, not ready, saying who holds the lock), so the kubelet neither restarts it
nor counts it as serving. `--node-lock-wait` bounds the wait for those who prefer an exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuslice.agent.front_ends import front_end_of
from gpuslice.agent.settings import AgentSettings
from gpuslice.aio.waiting import sleep_unless_stopped
from gpuslice.core.errors import GpusliceError
from gpuslice.host.nodelock import LOCK_NAME, NodeLock
from gpuslice.logs import get_logger
from gpuslice.metrics import MetricsServer
from gpuslice.metrics.server import ServerLimits

log = get_logger("gpuslice.agent")

LOCK_POLL_S = 0.5
"""How often a waiting agent tries the lock again: how long a node goes unserved after
its holder dies. One non-blocking `flock` per try (a blocking one in a thread could not
be given up on SIGTERM)."""


class NodeBusy(GpusliceError):
    """Another agent held the node for longer than `--node-lock-wait`."""


def node_lock_path(settings: AgentSettings) -> Path:
    """The lock of the mode's own kubelet directory: the one host path every agent of
    that mode must mount (same path on the host) to act at all."""
    return front_end_of(settings).lock_dir(settings) / LOCK_NAME


def check_host_dirs(settings: AgentSettings) -> None:
    """The front end's own directories, checked before they are used (DRA's: its plugin,
    registry, CDI and MPS directories), so that missing rights are one line naming the
    directory (`HostDirError`), not a traceback from whichever task met them first."""
    front_end_of(settings).check_host_dirs(settings)


def _holder_line(settings: AgentSettings) -> str:
    pod = f"{settings.namespace}/{settings.pod_name}" if settings.pod_name else "-"
    since = datetime.now(UTC).isoformat(timespec="seconds")
    node = settings.node_name or socket.gethostname()
    return f"pid={os.getpid()} pod={pod} node={node} since={since}"


@contextlib.asynccontextmanager
async def holding_the_node(
    settings: AgentSettings, stop: asyncio.Event, *, poll_s: float = LOCK_POLL_S
) -> AsyncIterator[bool]:
    """Yields True once this process holds the node (False: `stop` came while it waited);
    the lock is released when the block ends, after the agent has put everything away."""
    check_host_dirs(settings)
    lock = NodeLock(node_lock_path(settings))
    try:
        held = lock.try_acquire(_holder_line(settings))
        if not held:
            held = await _wait(lock, settings, stop, poll_s)
        yield held
    finally:
        lock.release()


async def _wait(
    lock: NodeLock, settings: AgentSettings, stop: asyncio.Event, poll_s: float
) -> bool:
    limit = settings.node_lock_wait_s
    holder = lock.holder()
    log.warning(
        "node-lock-busy",
        path=str(lock.path),
        holder=holder or "unknown",
        message="another agent acts on this node; waiting for it to exit"
        if limit is None
        else f"another agent acts on this node; waiting up to {limit:g} s",
    )
    started = time.monotonic()
    async with _probes_while_waiting(settings, lambda: (False, _not_ready(lock))):
        while True:
            if limit is not None and time.monotonic() - started >= limit:
                raise NodeBusy(
                    f"node lock {lock.path} is held by {lock.holder() or 'another process'}; "
                    f"gave up after {limit:g} s (--node-lock-wait / NODE_LOCK_WAIT)"
                )
            wait = (
                poll_s
                if limit is None
                else min(poll_s, max(0.0, limit - (time.monotonic() - started)))
            )
            if await sleep_unless_stopped(stop, wait):
                return False
            if lock.try_acquire(_holder_line(settings)):
                log.info(
                    "node-lock-taken",
                    path=str(lock.path),
                    after=holder or "unknown",
                    waited_s=round(time.monotonic() - started, 1),
                )
                return True
            now = lock.holder()
            if now and now != holder:  # a third agent got it in between: say who
                holder = now
                log.warning("node-lock-busy", path=str(lock.path), holder=now)


def _not_ready(lock: NodeLock) -> str:
    return f"waiting for the node lock {lock.path} (held by {lock.holder() or 'unknown'})\n"


@contextlib.asynccontextmanager
async def _probes_while_waiting(
    settings: AgentSettings, ready: Callable[[], tuple[bool, str]]
) -> AsyncIterator[None]:
    """`/healthz` alive and `/readyz` not ready on the ports the agent will serve them on,
    so the kubelet's liveness probe does not restart a waiting agent into a crash loop. A
    port that cannot be bound (the holder's, under hostNetwork) is logged and skipped."""
    ports = {p for p in (settings.health_port, settings.metrics_port) if p is not None}
    async with contextlib.AsyncExitStack() as stack:
        for port in sorted(ports):
            server = MetricsServer(
                CollectorRegistry(auto_describe=False),
                host=settings.metrics_address,
                port=port,
                ready=ready,
                limits=WAITING_LIMITS,
                routes="probes",
            )
            try:
                await stack.enter_async_context(server)
            except OSError as exc:
                log.warning("probes-unavailable-while-waiting", port=port, error=str(exc))
        yield


WAITING_LIMITS = ServerLimits(max_connections=32, max_per_address=8, max_scrapes=1)
"""A waiting agent only answers probes."""
