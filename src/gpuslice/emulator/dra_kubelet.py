"""The kubelet's DRA side, played over real unix sockets: plugin watcher plus DRA manager.

Tests and the demo run the real `gpuslice.dra` server against this. Like the kubelet it
watches the plugin registry directory (a scan at start, then inotify with a slow tick),
asks each `*.sock` (not starting with `.`) for `GetInfo`, picks the first of the plugin's
advertised services it supports (none: `NotifyRegistrationStatus(false, ...)`, as the
kubelet does), dials the DRA endpoint, and forgets a driver whose socket disappears.
`prepare` / `unprepare` call the chosen version's wire methods and check the answer as the
kubelet does (a skipped claim or an unknown UID is an error, not a result).

When the driver advertised `v1alpha1.DRAResourceHealth` (and this kubelet plays one with
the ResourceHealthStatus gate, the default), it also opens the device health stream, keeps
the latest health per `<pool>/<device>` (Unknown once a device was not refreshed within
its timeout, 30 s when the driver gave none), clears the driver's entries when the stream
ends and reopens it after a tick (the kubelet waits 5 s). `health(driver)` reads it.

Deliberate simplifications: no claim cache and no checkpoint. `restart()` drops every
registration and connection and rescans, like a kubelet restart; a real kubelet then
re-sends NodePrepareResources for the running pods from its checkpoint, so tests that
model a kubelet restart call `prepare` again themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.dirwatch import DirWatch
from gpuslice.aio.sockets import SocketId, socket_identity
from gpuslice.core.dra.health import health_message
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.text import shown, shown_all
from gpuslice.dra.convert import (
    claims_to_v1,
    claims_to_v1beta1,
    prepare_results_from_proto,
    unprepare_errors_from_proto,
)
from gpuslice.dra.rpc import (
    HEALTH_ADVERTISED,
    PLUGIN_TYPE,
    V1_ADVERTISED,
    V1BETA1_ADVERTISED,
    DraClientV1,
    DraClientV1beta1,
    DraHealthClient,
    RegistrationClient,
    unix_target,
)
from gpuslice.logs import get_logger
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.protos.drahealth.v1alpha1 import api_pb2 as health_pb
from gpuslice.protos.pluginregistration.v1 import api_pb2 as reg

__all__ = ["DeviceHealth", "DraKubeletEmulator", "DraKubeletError", "DraRegistration"]

KUBELET_VERSIONS = (V1_ADVERTISED, V1BETA1_ADVERTISED)
"""What a current kubelet (1.34+) can call, newest first."""
KUBELET_HEALTH_SERVICES = (HEALTH_ADVERTISED,)
"""Health services a kubelet with the ResourceHealthStatus gate streams from."""
DEFAULT_HEALTH_TIMEOUT_S = 30
"""The kubelet's `DefaultHealthTimeout`, for devices sent with no (or a non-positive) one."""

DeviceHealth = tuple[str, str]
"""(status, message): status is `Healthy`, `Unhealthy` or `Unknown`, as in pod status."""
_STATUS = {
    health_pb.HEALTHY: "Healthy",
    health_pb.UNHEALTHY: "Unhealthy",
    health_pb.UNKNOWN: "Unknown",
}


class DraKubeletError(Exception):
    """A DRA call failed as a whole, the way the kubelet would report it."""


@dataclass(frozen=True, slots=True)
class DraRegistration:
    """A driver the emulated kubelet accepted."""

    driver: str
    registration_socket: Path
    endpoint: str
    version: str
    """The advertised service chosen, e.g. `v1.DRAPlugin`."""


@dataclass(slots=True)
class _Connected:
    registration: DraRegistration
    identity: SocketId
    channel: grpc.aio.Channel
    health_task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        task, self.health_task = self.health_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.channel.close()


@dataclass(frozen=True, slots=True)
class _HealthEntry:
    status: str
    message: str
    last_updated: float
    """Unix seconds, as the driver sent it."""
    timeout_s: float


class DraKubeletEmulator:
    """Watches `registry_dir` like the kubelet's plugin watcher and calls DRA drivers.

    `versions` is what this kubelet supports (default: both, as 1.34+); pass
    `("v1beta1.DRAPlugin",)` to play a 1.32/1.33 kubelet. `health_services` are the health
    services it streams from (pass `()` for a kubelet without the ResourceHealthStatus
    gate). `rejections` maps a registration socket name to the error this kubelet sent
    back for it.
    """

    def __init__(
        self,
        registry_dir: Path,
        *,
        versions: Sequence[str] = KUBELET_VERSIONS,
        health_services: Sequence[str] = KUBELET_HEALTH_SERVICES,
        call_timeout_s: float = 45.0,
        tick_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        logger: BoundLogger | None = None,
    ) -> None:
        self.registry_dir = registry_dir
        self.versions = tuple(versions)
        self.health_services = tuple(health_services)
        self._clock = clock
        self._health: dict[str, dict[tuple[str, str], _HealthEntry]] = {}
        self.health_streams: dict[str, int] = {}
        """Health streams opened per driver (a reopened stream counts again)."""
        self.health_updates: dict[str, int] = {}
        """Health responses received per driver."""
        self.rejections: dict[str, str] = {}
        self._timeout = call_timeout_s
        self._tick = tick_s
        self._log = logger or get_logger("gpuslice.emulator.dra")
        self._drivers: dict[str, _Connected] = {}
        self._handled: dict[Path, SocketId] = {}
        """Sockets already answered (accepted or rejected), by the identity then seen."""
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch(), name="dra-kubelet-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for connected in self._drivers.values():
            await connected.close()
        self._drivers.clear()
        self._health.clear()
        self._handled.clear()
        self.rejections.clear()

    async def restart(self) -> None:
        """Forget every registration and connection, then rescan (see the module docstring)."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> DraKubeletEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- what tests ask -------------------------------------------------------------------

    def registration(self, driver: str) -> DraRegistration | None:
        connected = self._drivers.get(driver)
        return None if connected is None else connected.registration

    async def wait_registered(self, driver: str, timeout_s: float = 10.0) -> DraRegistration:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: driver in self._drivers), timeout_s
            )
        return self._drivers[driver].registration

    async def wait_unregistered(self, driver: str, timeout_s: float = 10.0) -> None:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: driver not in self._drivers), timeout_s
            )

    async def wait_rejected(self, socket_name: str, timeout_s: float = 10.0) -> str:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: socket_name in self.rejections), timeout_s
            )
        return self.rejections[socket_name]

    def health(self, driver: str) -> dict[tuple[str, str], DeviceHealth]:
        """(pool, device) -> (status, message) as this kubelet holds it now: what it
        would write into `allocatedResourcesStatus`; a device not refreshed within its
        timeout is Unknown. Empty while no health stream of `driver` is open."""
        now = self._clock()
        out: dict[tuple[str, str], DeviceHealth] = {}
        for key, entry in self._health.get(driver, {}).items():
            if now - entry.last_updated > entry.timeout_s:
                out[key] = ("Unknown", entry.message)
            else:
                out[key] = (entry.status, entry.message)
        return out

    async def wait_health(
        self,
        driver: str,
        predicate: Callable[[Mapping[tuple[str, str], DeviceHealth]], bool],
        timeout_s: float = 10.0,
    ) -> dict[tuple[str, str], DeviceHealth]:
        """Wait until `predicate(self.health(driver))` holds; that health."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate(current := self.health(driver)):
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"health of {driver} is still {current}")
            async with self._changed:
                # the Unknown timeout passes without any message: look again now and then
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
        return current

    async def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources for `claims`; per-claim errors are in the results."""
        connected = self._connected(driver)
        method = "NodePrepareResources"
        try:
            if connected.registration.version == V1_ADVERTISED:
                response_v1 = await DraClientV1(connected.channel).prepare(
                    v1.NodePrepareResourcesRequest(claims=claims_to_v1(claims)),
                    timeout_s=self._timeout,
                )
                results = prepare_results_from_proto(response_v1)
            else:
                response_b = await DraClientV1beta1(connected.channel).prepare(
                    v1beta1.NodePrepareResourcesRequest(claims=claims_to_v1beta1(claims)),
                    timeout_s=self._timeout,
                )
                results = prepare_results_from_proto(response_b)
        except grpc.aio.AioRpcError as exc:
            raise DraKubeletError(f"{method}: {exc.code().name}: {exc.details()}") from None
        _check_answer(method, claims, results.keys())
        return results

    async def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources for `claims`: claim UID -> error ("" = done)."""
        connected = self._connected(driver)
        method = "NodeUnprepareResources"
        try:
            if connected.registration.version == V1_ADVERTISED:
                response_v1 = await DraClientV1(connected.channel).unprepare(
                    v1.NodeUnprepareResourcesRequest(claims=claims_to_v1(claims)),
                    timeout_s=self._timeout,
                )
                errors = unprepare_errors_from_proto(response_v1)
            else:
                response_b = await DraClientV1beta1(connected.channel).unprepare(
                    v1beta1.NodeUnprepareResourcesRequest(claims=claims_to_v1beta1(claims)),
                    timeout_s=self._timeout,
                )
                errors = unprepare_errors_from_proto(response_b)
        except grpc.aio.AioRpcError as exc:
            raise DraKubeletError(f"{method}: {exc.code().name}: {exc.details()}") from None
        _check_answer(method, claims, errors.keys())
        return errors

    def _connected(self, driver: str) -> _Connected:
        connected = self._drivers.get(driver)
        if connected is None:
            raise DraKubeletError(f"DRA driver {shown(driver)} is not registered with the kubelet")
        return connected

    # -- the plugin watcher ---------------------------------------------------------------

    async def _watch(self) -> None:
        watch = DirWatch.open(self.registry_dir)
        try:
            while True:
                await self._scan()
                if watch is None:
                    await asyncio.sleep(min(self._tick, 0.2))
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.changed.wait(), self._tick)
                watch.changed.clear()
                if not watch.armed:
                    watch.rearm()
        finally:
            if watch is not None:
                watch.close()

    def _sockets(self) -> dict[Path, SocketId]:
        found: dict[Path, SocketId] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in self.registry_dir.iterdir():
                if path.name.startswith(".") or not path.name.endswith(".sock"):
                    continue
                with contextlib.suppress(OSError):
                    if not stat.S_ISSOCK(path.lstat().st_mode):
                        continue
                    identity = socket_identity(path)
                    if identity is not None:
                        found[path] = identity
        return found

    async def _scan(self) -> None:
        present = self._sockets()
        for path, identity in list(self._handled.items()):
            if present.get(path) != identity:
                del self._handled[path]
                self.rejections.pop(path.name, None)
                await self._deregister(path)
        for path, identity in present.items():
            if path not in self._handled:
                await self._register(path, identity)
        async with self._changed:
            self._changed.notify_all()

    async def _deregister(self, socket: Path) -> None:
        for driver, connected in list(self._drivers.items()):
            if connected.registration.registration_socket == socket:
                del self._drivers[driver]
                await connected.close()
                self._health.pop(driver, None)
                self._log.info("dra-kubelet-deregistered", driver=driver, socket=socket.name)

    async def _register(self, socket: Path, identity: SocketId) -> None:
        """GetInfo, validate, connect, notify; a plugin that does not answer is retried."""
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = RegistrationClient(channel)
            try:
                info = await client.get_info(timeout_s=self._timeout)
            except grpc.aio.AioRpcError as exc:
                self._log.warning(
                    "dra-kubelet-get-info-failed", socket=socket.name, error=exc.code().name
                )
                return
            version, error = self._choose(info)
            try:
                if error:
                    self.rejections[socket.name] = error
                    self._log.warning("dra-kubelet-rejected", socket=socket.name, error=error)
                else:
                    await self._connect(socket, identity, info, version)
                await client.notify(not error, error, timeout_s=self._timeout)
            except grpc.aio.AioRpcError as exc:
                self._log.warning(
                    "dra-kubelet-notify-failed", socket=socket.name, error=exc.code().name
                )
        self._handled[socket] = identity

    def _choose(self, info: reg.PluginInfo) -> tuple[str, str]:
        """(service to call, "") or ("", why the plugin is rejected), like the kubelet."""
        if info.type != PLUGIN_TYPE:
            return "", f"plugin type {shown(info.type)} is not handled by this kubelet emulator"
        if not info.name:
            return "", "plugin name is empty"
        if not info.supported_versions:
            return "", "plugin advertised no supported versions"
        for advertised in info.supported_versions:
            if advertised in self.versions:
                return advertised, ""
        return "", (
            f"none of services supported by the plugin ({shown_all(info.supported_versions)}) "
            f"are supported by the kubelet ({shown_all(self.versions)})"
        )

    async def _connect(
        self, socket: Path, identity: SocketId, info: reg.PluginInfo, version: str
    ) -> None:
        old = self._drivers.pop(info.name, None)
        if old is not None:
            await old.close()
        registration = DraRegistration(info.name, socket, info.endpoint, version)
        channel = grpc.aio.insecure_channel(unix_target(info.endpoint))
        connected = _Connected(registration, identity, channel)
        self._drivers[info.name] = connected
        health = self._health_service(info)
        if health:
            connected.health_task = asyncio.create_task(
                self._watch_health(info.name, channel), name=f"dra-kubelet-health-{info.name}"
            )
        self._log.info(
            "dra-kubelet-registered",
            driver=info.name,
            endpoint=info.endpoint,
            version=version,
            health=health or "-",
        )

    def _health_service(self, info: reg.PluginInfo) -> str:
        """The health service to stream from: one the plugin advertised and we support."""
        for advertised in info.supported_versions:
            if advertised in self.health_services:
                return advertised
        return ""

    async def _watch_health(self, driver: str, channel: grpc.aio.Channel) -> None:
        """The kubelet's health loop for one driver: stream, forget on end, reopen."""
        while True:
            try:
                self.health_streams[driver] = self.health_streams.get(driver, 0) + 1
                async for response in DraHealthClient(channel).watch():
                    await self._health_received(driver, response)
                self._log.info("dra-kubelet-health-ended", driver=driver)
            except grpc.aio.AioRpcError as exc:
                self._log.info("dra-kubelet-health-failed", driver=driver, error=exc.code().name)
            self._health.pop(driver, None)
            async with self._changed:
                self._changed.notify_all()
            await asyncio.sleep(self._tick)

    async def _health_received(
        self, driver: str, response: health_pb.NodeWatchResourcesResponse
    ) -> None:
        entries = self._health.setdefault(driver, {})
        for device in response.devices:
            timeout = device.health_check_timeout_seconds
            entries[(device.device.pool_name, device.device.device_name)] = _HealthEntry(
                status=_STATUS.get(device.health, "Unknown"),
                message=health_message(device.message),
                last_updated=float(device.last_updated_time),
                timeout_s=float(timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT_S),
            )
        self.health_updates[driver] = self.health_updates.get(driver, 0) + 1
        async with self._changed:
            self._changed.notify_all()


def _check_answer(method: str, claims: Sequence[ClaimRef], answered: Iterable[str]) -> None:
    """The kubelet's checks on a response map: no unknown UID, no claim left out."""
    keys = set(answered)
    asked = {c.uid for c in claims}
    unknown = sorted(keys - asked)
    if unknown:
        raise DraKubeletError(
            f"{method} returned result for unknown claim UID {shown_all(unknown)}"
        )
    missing = asked - keys
    if missing:
        raise DraKubeletError(
            f"{method} skipped {len(missing)} ResourceClaims: {shown_all(sorted(missing))}"
        )
