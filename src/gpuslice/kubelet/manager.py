"""One device plugin server per advertised resource, kept in step with the plan and kubelet.

Three things change under a running daemon and each is handled here without a restart:
the plan (a config reload adds or removes resources: servers are started or stopped, the
others keep serving and their streams send the new lists), the kubelet (a new kubelet
deletes every socket in the directory and creates its own: every server is recreated and
registered again), and our own socket file (deleted by someone: recreated and registered).
The check is level-triggered (socket inode and ctime, compared with what was last seen);
it runs when inotify says the directory changed (`aio.dirwatch`), on a slow safety-net
tick, and every 150 ms where the directory cannot be watched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.dirwatch import DirWatch
from gpuslice.aio.sockets import SocketId, socket_identity
from gpuslice.aio.waiting import sleep_unless_stopped, unless_stopped
from gpuslice.kubelet.convert import register_request
from gpuslice.kubelet.registration import Backoff, register_until_done
from gpuslice.kubelet.rpc import device_plugin_handler, unix_target
from gpuslice.kubelet.servicer import (
    AllocateObserver,
    CapsSource,
    DevicePluginServicer,
    ListingCache,
    existing_dev_nodes,
)
from gpuslice.logs import get_logger
from gpuslice.state import PlanState, Snapshot


@dataclass(frozen=True, slots=True)
class ManagerSettings:
    register_timeout_s: float = 5.0
    """Seconds to wait for the kubelet socket to answer and for Register (NVIDIA: 5 s)."""
    ready_timeout_s: float = 5.0
    """Seconds to wait for our own socket to answer before registering it (NVIDIA: 5 s)."""
    watch_interval_s: float = 0.15
    """How often the kubelet's and our sockets are checked for being recreated or deleted,
    where the directory cannot be watched with inotify."""
    watched_interval_s: float = 30.0
    """The safety-net check while inotify watches the directory: changes wake the check at
    once (a replaced directory too: its watch ends, which is a change), this only bounds how
    long an event inotify never gave can go unseen. It was 2 s, half an idle daemon's
    wake-ups from this loop; the kubelet's own restart is seen by inotify."""
    stop_grace_s: float = 2.0
    """Grace for in-flight calls when a server stops (streams end at once on their own)."""
    register_backoff: Backoff = field(default_factory=Backoff)
    """Retry delays for failed registrations."""
    start_backoff: Backoff = field(default_factory=Backoff)
    """Retry delays for a server that failed to start (e.g. the directory is not writable)."""


@dataclass(slots=True)
class _Plugin:
    resource: str
    socket: Path
    listing: ListingCache
    server: grpc.aio.Server | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    identity: SocketId | None = None
    registration: asyncio.Task[None] | None = None
    registered_with: SocketId | None = None
    """The kubelet socket our last successful Register went to."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to cut a registration retry's backoff short (the kubelet socket came back)."""
    failed_starts: int = 0
    retry_at: float = 0.0


class DevicePluginManager:
    def __init__(
        self,
        state: PlanState,
        *,
        plugin_dir: Path,
        kubelet_socket: Path | None,
        logger: BoundLogger | None = None,
        dev_nodes_probe: Callable[[], frozenset[str]] | None = None,
        settings: ManagerSettings | None = None,
        on_allocate: AllocateObserver | None = None,
        caps: CapsSource | None = None,
    ) -> None:
        self._on_allocate = on_allocate
        self._caps = caps
        self._state = state
        self._dir = plugin_dir
        self._kubelet_socket = kubelet_socket
        self._log = logger or get_logger("gpuslice.kubelet")
        self._dev_nodes_probe = dev_nodes_probe or existing_dev_nodes
        self._settings = settings or ManagerSettings()
        self._plugins: dict[str, _Plugin] = {}
        self._kubelet_id: SocketId | None = None
        self._lock = asyncio.Lock()
        self.socket_checks = 0
        """Rounds of the socket watcher run (tests wait for rounds to check that one changed
        nothing, rather than for time)."""

    @property
    def serving(self) -> dict[str, Path]:
        """Resource name -> socket path of every server now running."""
        return {n: p.socket for n, p in self._plugins.items() if p.server is not None}

    @property
    def registered(self) -> dict[str, bool]:
        """Resource name -> whether the kubelet took our last Register (the readiness probe);
        always True when no kubelet socket is configured (standalone runs)."""
        standalone = self._kubelet_socket is None
        return {
            n: p.server is not None and (standalone or p.registered_with is not None)
            for n, p in self._plugins.items()
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; then end streams, stop servers and remove sockets."""
        try:
            if self._kubelet_socket is not None:
                self._kubelet_id = socket_identity(self._kubelet_socket)
            snapshot = self._state.current
            async with self._lock:
                await self._reconcile(snapshot)
            if not self._plugins:
                self._log.info("no-devices", message="No devices found. Waiting.")
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._follow_plan(stop, snapshot.version), name="dp-follow-plan")
                tg.create_task(self._watch_sockets(stop), name="dp-watch-sockets")
        finally:
            async with self._lock:
                for name in list(self._plugins):
                    await self._remove(name)

    # -- plan ------------------------------------------------------------------------------

    async def _follow_plan(self, stop: asyncio.Event, version: int) -> None:
        while True:
            snapshot = await unless_stopped(stop, self._state.wait_newer(version))
            if snapshot is None:
                return
            version = snapshot.version
            async with self._lock:
                await self._reconcile(snapshot)

    async def _reconcile(self, snapshot: Snapshot) -> None:
        wanted = {r.name: r for r in snapshot.plan.resources if r.devices}
        for name in [n for n in self._plugins if n not in wanted]:
            self._log.info("resource-removed", resource=name)
            await self._remove(name)
        for name, resource in wanted.items():
            if name in self._plugins:
                continue
            plugin = _Plugin(name, self._dir / resource.socket_name, ListingCache(name))
            self._plugins[name] = plugin
            self._log.info(
                "resource-added",
                resource=name,
                devices=len(resource.devices),
                socket=resource.socket_name,
            )
            await self._start(plugin)

    # -- sockets ---------------------------------------------------------------------------

    async def _watch_sockets(self, stop: asyncio.Event) -> None:
        """Converge every tick: each plugin serving on its own socket, registered with the
        kubelet socket that exists now. Level-triggered, so a change seen in any order (our
        socket deleted first, the kubelet's socket recreated later, or both between two
        ticks) ends in exactly one registration with the new kubelet.
        """
        watch = DirWatch.open(self._dir)
        try:
            while not await self._next_tick(stop, watch):
                async with self._lock:
                    await self._check_sockets()
                self.socket_checks += 1
        finally:
            if watch is not None:
                watch.close()

    async def _next_tick(self, stop: asyncio.Event, watch: DirWatch | None) -> bool:
        """Wait for a directory change (or the interval); True when `stop` was set."""
        if watch is None:
            return await sleep_unless_stopped(stop, self._settings.watch_interval_s)
        if not watch.armed:
            watch.rearm()
        interval = (
            self._settings.watched_interval_s if watch.armed else self._settings.watch_interval_s
        )
        woke = await unless_stopped(stop, _wait_changed(watch, interval))
        return woke is None or stop.is_set()

    async def _check_sockets(self) -> None:
        now = asyncio.get_running_loop().time()
        kubelet_id = self._kubelet_now()
        for plugin in self._plugins.values():
            if plugin.server is None:
                if now >= plugin.retry_at:
                    await self._start(plugin)
            elif socket_identity(plugin.socket) != plugin.identity:
                self._log.warning(
                    "socket-lost",
                    resource=plugin.resource,
                    socket=plugin.socket.name,
                    action="recreate",
                )
                await self._stop_server(plugin)
                await self._start(plugin)
            elif kubelet_id is not None and plugin.registered_with != kubelet_id:
                if plugin.registration is None or plugin.registration.done():
                    self._register(plugin)
                else:
                    plugin.wake.set()

    def _kubelet_now(self) -> SocketId | None:
        """The kubelet socket's identity; logs once per new kubelet socket."""
        if self._kubelet_socket is None:
            return None
        current = socket_identity(self._kubelet_socket)
        previous, self._kubelet_id = self._kubelet_id, current
        if current is not None and current != previous:
            self._log.info(
                "kubelet-socket-created",
                socket=str(self._kubelet_socket),
                action="register-again",
            )
        return current

    # -- one plugin ------------------------------------------------------------------------

    async def _start(self, plugin: _Plugin) -> None:
        """Serve `plugin` on a fresh socket, then register it. Never raises."""
        try:
            await self._start_server(plugin)
        except Exception as exc:
            plugin.failed_starts += 1
            delay = self._settings.start_backoff.delay(plugin.failed_starts)
            plugin.retry_at = asyncio.get_running_loop().time() + delay
            self._log.error(
                "serve-failed",
                resource=plugin.resource,
                socket=str(plugin.socket),
                retry_in_s=round(delay, 1),
                error=str(exc),
            )
            await self._stop_server(plugin)
            return
        plugin.failed_starts = 0
        self._log.info("serving", resource=plugin.resource, socket=str(plugin.socket))
        self._register(plugin)

    async def _start_server(self, plugin: _Plugin) -> None:
        with contextlib.suppress(FileNotFoundError):
            plugin.socket.unlink()
        plugin.stopping = asyncio.Event()
        servicer = DevicePluginServicer(
            self._state,
            plugin.resource,
            listing=plugin.listing,
            stopping=plugin.stopping,
            logger=self._log,
            dev_nodes_probe=self._dev_nodes_probe,
            on_allocate=self._on_allocate,
            caps=self._caps,
        )
        server = grpc.aio.server()
        plugin.server = server
        server.add_generic_rpc_handlers((device_plugin_handler(servicer),))
        server.add_insecure_port(unix_target(str(plugin.socket)))
        await server.start()
        plugin.identity = socket_identity(plugin.socket)
        async with grpc.aio.insecure_channel(unix_target(str(plugin.socket))) as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), self._settings.ready_timeout_s)
            except TimeoutError:
                raise RuntimeError(
                    f"own socket did not answer within {self._settings.ready_timeout_s:g}s"
                ) from None

    def _register(self, plugin: _Plugin) -> None:
        if self._kubelet_socket is None:
            return
        if plugin.registration is not None:
            plugin.registration.cancel()
        plugin.registered_with = None
        plugin.registration = asyncio.create_task(
            self._registration(plugin, self._kubelet_socket),
            name=f"dp-register-{plugin.resource}",
        )

    async def _registration(self, plugin: _Plugin, kubelet_socket: Path) -> None:
        plugin.registered_with = await register_until_done(
            kubelet_socket,
            register_request(plugin.resource, plugin.socket.name),
            timeout_s=self._settings.register_timeout_s,
            backoff=self._settings.register_backoff,
            logger=self._log,
            wake=plugin.wake,
        )

    async def _stop_server(self, plugin: _Plugin) -> None:
        task, plugin.registration = plugin.registration, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        plugin.stopping.set()
        server, plugin.server = plugin.server, None
        if server is not None:
            await server.stop(self._settings.stop_grace_s)
        if plugin.identity is not None and socket_identity(plugin.socket) == plugin.identity:
            with contextlib.suppress(FileNotFoundError):
                plugin.socket.unlink()
        plugin.identity = None
        plugin.registered_with = None

    async def _remove(self, name: str) -> None:
        plugin = self._plugins.pop(name)
        await self._stop_server(plugin)
        self._log.info("stopped", resource=name, socket=plugin.socket.name)


async def _wait_changed(watch: DirWatch, interval_s: float) -> bool:
    """True when the directory changed within `interval_s`; clears the flag for the next."""
    try:
        await asyncio.wait_for(watch.changed.wait(), interval_s)
    except TimeoutError:
        return False
    watch.changed.clear()
    return True
