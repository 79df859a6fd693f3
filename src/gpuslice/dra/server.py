"""Serving a DRA driver to the kubelet: the DRA socket, then the registration socket.

The order matters: the kubelet may call NodePrepareResources as soon as it has read
`GetInfo`, so `dra.sock` is listening before `<driver>-reg.sock` appears. Stale socket files
of an earlier run are unlinked before listening; on stop only the files this server created
(same inode) are removed, never another plugin's. A registration socket deleted under us
(kubelet or node cleanup of the plugins_registry dir) is recreated, which makes the kubelet
register us again: inotify on the registry dir wakes the check, a slow tick is the safety
net (and the only watch on `dra.sock`, whose directory is ours).

Given a health source, `dra.sock` also serves the device health stream
(`v1alpha1.DRAResourceHealth`, `gpuslice.dra.health`), advertised after the DRAPlugin
versions; stopping ends open health streams with OK before the sockets close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.dirwatch import DirWatch
from gpuslice.aio.sockets import SocketId, socket_identity
from gpuslice.core.text import shown
from gpuslice.dra.health import (
    DEFAULT_HEALTH_REFRESH_S,
    DEFAULT_HEALTH_TIMEOUT_S,
    DraHealthServicer,
    HealthSource,
)
from gpuslice.dra.registration import RegistrationServicer, RegistrationStatus
from gpuslice.dra.rpc import (
    HEALTH_ADVERTISED,
    SUPPORTED_VERSIONS,
    dra_handlers,
    health_handler,
    registration_handler,
    unix_target,
)
from gpuslice.dra.servicer import DraServicer
from gpuslice.logs import get_logger
from gpuslice.ports import ClaimPreparer

DRA_SOCKET_NAME = "dra.sock"
MAX_DRIVER_NAME_CHARS = 63
MAX_SOCKET_PATH_BYTES = 107
"""`sun_path` holds 108 bytes including the terminating NUL."""
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class DraServerError(Exception):
    """The DRA server cannot start: bad driver name, missing directory, path too long."""


def validate_driver_name(name: str) -> None:
    """A DRA driver name is a lowercase DNS subdomain of at most 63 characters."""
    if len(name) > MAX_DRIVER_NAME_CHARS:
        raise DraServerError(
            f"DRA driver name {shown(name)} is {len(name)} characters long; "
            f"at most {MAX_DRIVER_NAME_CHARS} are allowed"
        )
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise DraServerError(
            f"DRA driver name {shown(name)} is not a DNS subdomain (lowercase letters, digits, "
            "'-' and '.', starting and ending with a letter or digit), e.g. gpu.example.com"
        )


@dataclass(frozen=True, slots=True)
class DraServerSettings:
    endpoint: str = ""
    """The DRA socket path as the kubelet sees it; "" = the absolute `<plugin_dir>/dra.sock`
    (right when the plugin dir is mounted at the same path, as the kubelet requires)."""
    versions: tuple[str, ...] = SUPPORTED_VERSIONS
    """DRAPlugin services advertised in GetInfo, newest first (the health service, when
    served, is added after them)."""
    health_timeout_s: int = DEFAULT_HEALTH_TIMEOUT_S
    """`health_check_timeout_seconds` told to the kubelet for every device."""
    health_refresh_s: float = DEFAULT_HEALTH_REFRESH_S
    """How often an unchanged health list is sent again (at most half the timeout)."""
    check_tick_s: float = 5.0
    """Safety-net interval for checking that our sockets still exist."""
    stop_grace_s: float = 1.0
    """How long calls in flight may finish when the server stops."""


class DraPluginServer:
    """The DRA service and plugin registration sockets of one driver.

    Use `async with DraPluginServer(...) as server:` or `await server.run(stop)`.
    `server.status` says what the kubelet answered to our registration.
    """

    def __init__(
        self,
        driver_name: str,
        plugin_dir: Path,
        registry_dir: Path,
        preparer: ClaimPreparer,
        *,
        settings: DraServerSettings | None = None,
        logger: BoundLogger | None = None,
        health: HealthSource | None = None,
    ) -> None:
        validate_driver_name(driver_name)
        self.driver_name = driver_name
        self.plugin_dir = plugin_dir
        self.registry_dir = registry_dir
        self.dra_socket = plugin_dir / DRA_SOCKET_NAME
        self.registration_socket = registry_dir / f"{driver_name}-reg.sock"
        self._settings = settings or DraServerSettings()
        self._log = logger or get_logger("gpuslice.dra")
        self.status = RegistrationStatus()
        self._servicer = DraServicer(preparer, logger=self._log)
        self.health: DraHealthServicer | None = None
        if health is not None:
            self.health = DraHealthServicer(
                health,
                logger=self._log,
                timeout_s=self._settings.health_timeout_s,
                refresh_s=self._settings.health_refresh_s,
            )
        self._servers: dict[Path, tuple[grpc.aio.Server, SocketId | None]] = {}
        self._watch_task: asyncio.Task[None] | None = None
        for path in (self.dra_socket, self.registration_socket):
            longest = max(len(str(p).encode()) for p in (path, _hidden(path)))
            if longest > MAX_SOCKET_PATH_BYTES:
                raise DraServerError(
                    f"socket path {shown(str(path), 200)} is longer than "
                    f"{MAX_SOCKET_PATH_BYTES} bytes (the unix socket limit)"
                )

    @property
    def versions(self) -> tuple[str, ...]:
        """What GetInfo advertises: the DRAPlugin versions, then the health service if
        served. The kubelet takes the first DRAPlugin version it knows in this order."""
        versions = self._settings.versions
        if self.health is not None and HEALTH_ADVERTISED not in versions:
            versions = (*versions, HEALTH_ADVERTISED)
        return versions

    @property
    def endpoint(self) -> str:
        return self._settings.endpoint or str(self.dra_socket.absolute())

    async def start(self) -> None:
        if not self.registry_dir.is_dir():
            raise DraServerError(
                f"plugin registry directory {self.registry_dir} does not exist "
                "(mount the kubelet's plugins_registry there)"
            )
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        if self.health is not None:
            self.health.open()
        try:
            await self._serve_dra()
            await self._serve_registration()
        except BaseException:
            await self.stop()
            raise
        self._watch_task = asyncio.create_task(self._watch(), name=f"dra-watch-{self.driver_name}")

    async def stop(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.health is not None:
            self.health.close()  # open health streams end with OK, not cut by the stop
        for path in (self.registration_socket, self.dra_socket):
            await self._close(path)
        self._log.info("dra-stopped", driver=self.driver_name)

    async def run(self, stop: asyncio.Event) -> None:
        async with self:
            await stop.wait()

    async def __aenter__(self) -> DraPluginServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- sockets --------------------------------------------------------------------------

    async def _serve_dra(self) -> None:
        handlers = dra_handlers(self._servicer)
        if self.health is not None:
            handlers = (*handlers, health_handler(self.health))
        await self._serve(self.dra_socket, handlers)
        self._log.info(
            "dra-serving",
            driver=self.driver_name,
            socket=str(self.dra_socket),
            api=",".join(self.versions),
        )

    async def _serve_registration(self) -> None:
        self.status.reset()
        servicer = RegistrationServicer(
            self.driver_name,
            self.endpoint,
            self.versions,
            status=self.status,
            logger=self._log,
        )
        await self._serve(self.registration_socket, (registration_handler(servicer),))
        self._log.info(
            "dra-registration-socket",
            driver=self.driver_name,
            socket=str(self.registration_socket),
            endpoint=self.endpoint,
        )

    async def _serve(self, path: Path, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        """Listen on a hidden name, then rename it into place.

        gRPC unlinks the path it listened on when it stops, whoever's file is there by then;
        listening on a private name keeps it from ever removing another plugin's socket at
        our name, and the rename makes the socket appear ready and replaces a stale file.
        """
        await self._close(path)
        hidden = _hidden(path)
        _unlink(hidden)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(handlers)
        server.add_insecure_port(unix_target(str(hidden)))
        await server.start()
        os.replace(hidden, path)
        self._servers[path] = (server, socket_identity(path))

    async def _close(self, path: Path) -> None:
        entry = self._servers.pop(path, None)
        if entry is None:
            return
        server, identity = entry
        await server.stop(self._settings.stop_grace_s)
        if identity is not None and socket_identity(path) == identity:
            _unlink(path)

    # -- keeping the sockets there --------------------------------------------------------

    async def _watch(self) -> None:
        watch = DirWatch.open(self.registry_dir)
        tick = self._settings.check_tick_s
        try:
            while True:
                if watch is None:
                    await asyncio.sleep(min(tick, 0.5))
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(watch.changed.wait(), tick)
                    watch.changed.clear()
                    if not watch.armed:
                        watch.rearm()
                await self._heal()
        finally:
            if watch is not None:
                watch.close()

    async def _heal(self) -> None:
        """Recreate a socket of ours whose file is gone.

        A file someone else put under our name (a second instance) is left alone: a plugin
        never deletes another's socket.
        """
        for path, restart in (
            (self.dra_socket, self._serve_dra),
            (self.registration_socket, self._serve_registration),
        ):
            if path in self._servers and socket_identity(path) is not None:
                continue
            self._log.warning("dra-socket-recreated", driver=self.driver_name, socket=str(path))
            try:
                await restart()
            except Exception as exc:  # keep watching: the next tick tries again
                self._log.error("dra-socket-failed", socket=str(path), error=str(exc))


def _unlink(path: Path) -> None:
    """Remove a socket file (a quick, non-blocking metadata operation on a local dir)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _hidden(path: Path) -> Path:
    """Where a socket is created before it is renamed into place.

    Short (a long driver name must still fit the unix path limit), per process, and
    starting with `.`, which the kubelet's plugin watcher ignores.
    """
    return path.with_name(f".gs{os.getpid()}.sock")
