"""Keeping one MPS control daemon running per MPS resource, configured as the plan says.

Each daemon gets its own supervisor task: prepare directories, start the daemon, send the
limits (a running daemon forgets them on quit, so they are sent after every start), then
ask it every few seconds whether it answers. A daemon that died or hangs is killed and
started again, and its resource is reported not ready meanwhile so the plugin can take its
replicas out of service. `<root>/.ready` exists only while every daemon answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuslice.aio.programs import ProgramError as MpsError
from gpuslice.core.devices import GpuUuid
from gpuslice.core.mps import (
    STARTED_MARKER,
    MpsDaemonSpec,
    left_behind_spec,
    mps_root,
    shm_dir,
)
from gpuslice.logs import get_logger
from gpuslice.mps.control import (
    PID_FILE,
    SOCKET_NAME,
    MpsControl,
    MpsControlFactory,
    process_alive,
)
from gpuslice.mps.identity import IdentityError, read_bounded, read_pid_file
from gpuslice.mps.readiness import Readiness, ReadinessListener
from gpuslice.mps.shm import ShmMounts, unmount
from gpuslice.ports import ComputeModeSetter

HEALTH_COMMAND = "get_default_active_thread_percentage"
RECORD_LIMIT = 64 * 1024
"""The most of a started marker (the settings a daemon was started with) ever read."""


@dataclass(frozen=True, slots=True)
class MpsTimings:
    health_interval_s: float = 5.0
    """Seconds between health commands to each daemon."""
    start_timeout_s: float = 10.0
    """How long a freshly started daemon may take before it answers (seconds)."""
    start_poll_s: float = 0.1
    """Pause between health commands while waiting for a fresh daemon (seconds)."""
    retry_interval_s: float = 30.0
    """Pause after a failed start before the next attempt; NVIDIA's is 30 s."""


@dataclass(frozen=True, slots=True)
class DaemonState:
    """One MPS daemon as `/status` and `top` show it."""

    resource: str
    state: Literal["ready", "starting", "down"]
    problem: str | None
    """Why it is down (the last failed start, a lost socket); None otherwise."""


@dataclass(slots=True)
class _Daemon:
    spec: MpsDaemonSpec
    control: MpsControl
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    exclusive: list[GpuUuid] = field(default_factory=list)
    """GPUs whose compute mode this supervisor set, to be reset to DEFAULT on stop."""


class MpsDaemonManager:
    def __init__(
        self,
        specs: Iterable[MpsDaemonSpec],
        control_factory: MpsControlFactory,
        *,
        compute_mode: ComputeModeSetter | None = None,
        timings: MpsTimings | None = None,
        logger: logging.Logger | None = None,
        on_readiness: ReadinessListener | None = None,
        keep_running: bool = False,
        shm: ShmMounts | None = None,
    ) -> None:
        """`keep_running` (the agent's managers, both modes): the daemons serve pods that
        keep running while the agent restarts (a rollout, a crash, a force-deleted pod), so
        when the manager stops or is cancelled they are left running, and at start a daemon
        that already answers in a spec's pipe directory is taken over instead of restarted
        when it was started with the spec's settings (its started marker records them). A
        daemon whose spec is removed or changed is still stopped. `shm` mounts a
        size-limited tmpfs on a daemon's shm directory before it starts and unmounts it
        once no daemon uses it (`mps.shm`); None leaves plain directories."""
        self._keep_running = keep_running
        self._shm = shm
        self._shm_users: dict[str, set[str]] = {}
        """shm directory -> the resources whose daemons run on it (device-plugin mode shares
        one among all its daemons)."""
        self._shm_locks: dict[str, asyncio.Lock] = {}
        self._shm_told: set[str] = set()
        """The reasons a tmpfs could not be mounted that were reported already."""
        self._leaving = False
        self._specs = _unique(specs)
        self._factory = control_factory
        self._compute_mode = compute_mode
        self._timings = timings or MpsTimings()
        # structured events (`gpuslice.logs`) through the given stdlib logger's name
        self._log = get_logger(logger.name if logger is not None else "gpuslice.mps")
        self._readiness = Readiness()
        # First listener: markers are current before anyone else hears of a change.
        self._readiness.add_listener(lambda _resource, _ready: self._update_markers())
        if on_readiness is not None:
            self._readiness.add_listener(on_readiness)
        self._daemons: dict[str, _Daemon] = {}
        self._stopping: dict[str, asyncio.Task[None]] = {}
        """Supervisors told to stop whose daemons may still be quitting, by resource."""
        self._group: asyncio.TaskGroup | None = None
        self._lock = asyncio.Lock()
        self._markers: set[Path] = set()
        self._problems: list[str] = []
        self._down_because: dict[str, str] = {}

    # -- readiness, for the agent ---------------------------------------------------------

    def ready(self, resource: str) -> bool:
        """True while the resource's daemon runs with its limits applied and answers."""
        return self._readiness.ready(resource)

    def readiness(self) -> dict[str, bool]:
        return self._readiness.snapshot()

    @property
    def version(self) -> int:
        return self._readiness.version

    async def wait_changed(self, version: int) -> int:
        """Wait until readiness changed after `version` (from `version`); the new version."""
        return await self._readiness.wait_changed(version)

    def add_listener(self, listener: ReadinessListener) -> None:
        self._readiness.add_listener(listener)

    @property
    def problems(self) -> tuple[str, ...]:
        """Problems worth telling the user about (compute mode not set, failed starts)."""
        return tuple(self._problems)

    @property
    def specs(self) -> tuple[MpsDaemonSpec, ...]:
        return self._specs

    def daemons(self) -> list[DaemonState]:
        """Each wanted daemon's state, for `/status` and `top`: answering, starting, or
        down with the problem that keeps it down (a start that failed, a lost socket)."""
        out: list[DaemonState] = []
        for spec in self._specs:
            if self._readiness.ready(spec.resource):
                out.append(DaemonState(spec.resource, "ready", None))
            elif (problem := self._down_because.get(spec.resource)) is None:
                out.append(DaemonState(spec.resource, "starting", None))
            else:
                out.append(DaemonState(spec.resource, "down", problem))
        return out

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Supervise the daemons until `stop` is set, then quit them and clean up."""
        if self._group is not None:
            raise RuntimeError("MpsDaemonManager.run is already running")
        self._leaving = False
        try:
            async with asyncio.TaskGroup() as group:
                async with self._lock:
                    self._group = group
                    for spec in self._specs:
                        self._launch(spec)
                await stop.wait()
                async with self._lock:
                    self._leaving = True
                    self._group = None
                    for daemon in self._daemons.values():
                        daemon.stop.set()
        finally:
            self._group = None
            self._daemons.clear()
            self._stopping.clear()
            self._update_markers()

    async def reconfigure(self, specs: Iterable[MpsDaemonSpec]) -> None:
        """Apply a new set of daemons: stop removed or changed ones, then start the new ones.

        A changed spec (other GPUs or limits) means a restart: a running MPS server does not
        pick up new defaults. Returns once the old daemons are stopped and the new ones are
        starting; follow readiness to know when they answer.
        """
        wanted = _unique(specs)
        async with self._lock:
            self._specs = wanted
            if self._group is None:
                return
            by_name: dict[str, MpsDaemonSpec] = {s.resource: s for s in wanted}
            retuned = [
                d
                for r, d in self._daemons.items()
                if r in by_name
                and by_name[r] != d.spec
                and d.spec.same_daemon(by_name[r])
                and await self._can_retune(d, by_name)
            ]
            for daemon in retuned:
                daemon.spec = by_name[daemon.spec.resource]
            outdated = [d for r, d in self._daemons.items() if by_name.get(r) != d.spec]
            for daemon in outdated:
                daemon.stop.set()
                del self._daemons[daemon.spec.resource]
                if daemon.task is not None:
                    self._stopping[daemon.spec.resource] = daemon.task
            for spec in wanted:
                if spec.resource not in self._daemons:
                    # a restart reuses the pipe directory: the old daemon must be gone first
                    await self._stopped(spec.resource)
                    self._launch(spec)
            self._update_markers()
        # Removed daemons are awaited outside the lock: stopping one that hangs (up to the
        # quit grace period) does not hold up starting the daemons of other resources.
        for daemon in outdated:
            await self._stopped(daemon.spec.resource)
        for daemon in retuned:
            await self._retune(daemon)

    async def _can_retune(self, daemon: _Daemon, by_name: dict[str, MpsDaemonSpec]) -> bool:
        """Whether `daemon` is retuned to what `by_name` wants rather than restarted. A
        default pinned limit the new defaults drop cannot be lifted by a retune
        (`MpsDaemonSpec.pinned_cleared`): with no MPS server running, no client is
        connected and the daemon is restarted without it (False); with one (or when the
        daemon cannot tell), a restart would cut its clients, so the limit is kept, written
        into the wanted spec (its read-back expects it) and reported, until a later change
        finds the daemon without a server."""
        spec = daemon.spec
        wanted = by_name[spec.resource]
        cleared = spec.pinned_cleared(wanted)
        if not cleared:
            return True
        try:
            servers = (await daemon.control.send("get_server_list")).split()
        except MpsError:
            servers = ["unknown"]
        if not servers:
            self._log.info(
                "mps-daemon-replaced", resource=spec.resource, reason="pinned limit lifted"
            )
            return False
        by_name[spec.resource] = spec.keeping_pinned(wanted)
        self._report(
            f"MPS daemon for {spec.resource} keeps its default pinned memory limit on "
            f"device(s) {', '.join(map(str, cleared))}: MPS has no command that removes one, "
            f"and its server {' '.join(servers)} may have clients a restart would cut"
        )
        return True

    async def _retune(self, daemon: _Daemon) -> None:
        """Send a running retunable daemon its new defaults, and its running MPS servers the
        same limits (a server keeps the defaults it started with; `set_device_pinned_mem_limit`
        and `set_active_thread_percentage` on its PID shape the clients it accepts from now
        on). A daemon still starting is sent them as it starts; one that does not take them
        is unready until a health round finds them in place (`_hold_settings`)."""
        spec = daemon.spec
        if not self.ready(spec.resource):
            return
        try:
            await _configure(daemon.control, spec)
            for pid in await _server_pids(daemon.control):
                for index, mib in spec.pinned_mem_limits_mib:
                    await daemon.control.send(f"set_device_pinned_mem_limit {pid} {index} {mib}M")
                await daemon.control.send(
                    f"set_active_thread_percentage {pid} {spec.active_thread_percentage}"
                )
            _record(spec)
        except (MpsError, OSError) as exc:
            self._report(
                f"MPS daemon for {spec.resource} did not take its new defaults ({exc}); "
                "unready until it does"
            )
            self._mark(spec, False)
            return
        self._log.info(
            "mps-daemon-retuned", resource=spec.resource, settings="; ".join(spec.commands)
        )

    async def _stopped(self, resource: str) -> None:
        task = self._stopping.get(resource)
        if task is None:
            return
        await asyncio.shield(task)  # a cancelled caller leaves the supervisor to finish
        if self._stopping.get(resource) is task:
            del self._stopping[resource]

    async def terminate_clients(self, gpu_uuid: str, pids: Iterable[int]) -> int:
        """Ask each MPS server serving `gpu_uuid` to terminate these client processes
        (`terminate_client <server PID> <client PID>`), before the memory guard signals them:
        NVIDIA's MPS documentation says killing a client without it is unsupported (its
        server and the other clients may hang). PIDs are the host's, as the control daemon
        sees them. Returns how many (server, client) pairs were asked; a server answers for
        its own clients only, and a daemon that does not answer is skipped (the signal still
        follows)."""
        wanted = sorted(set(pids))
        asked = 0
        for daemon in list(self._daemons.values()):
            if gpu_uuid not in daemon.spec.gpu_uuids or not wanted:
                continue
            try:
                for server in await _server_pids(daemon.control):
                    for pid in wanted:
                        await daemon.control.send(f"terminate_client {server} {pid}")
                        asked += 1
            except MpsError as exc:
                self._log.warning(
                    "mps-terminate-client-failed",
                    resource=daemon.spec.resource,
                    pids=",".join(map(str, wanted)),
                    error=str(exc),
                )
        return asked

    async def quit_stray(self, spec: MpsDaemonSpec) -> bool:
        """Ask a daemon at `spec`'s pipe directory that this manager does not supervise to
        quit (one left running for a claim the record no longer holds); True if one
        answered. Only `quit`: a daemon this process did not start is never signalled. One
        that can be identified (`MpsControl.watch_running`) is waited for, so what follows
        (a compute mode reset) comes after it ended."""
        if spec.resource in self._daemons:
            return False
        control = self._factory(spec)
        if await self._check(control) is not None:
            return False
        control.watch_running()
        await _quietly(control.terminate())
        self._log.info("mps-stray-daemon-asked-to-quit", pipe_dir=str(spec.pipe_dir))
        return True

    async def quit_left_behind(self, root: str) -> None:
        """At the agent's start, before anything is advertised: what an earlier agent left
        under `root` (`keep_running`) that this manager's specs no longer want, undone as a
        live reload to the same config undoes it. A daemon of a resource no spec names (a
        restart into a config without MPS, a renamed MPS resource, another node label) is
        asked to quit and its started marker removed; then the GPUs its marker records,
        and those a wanted resource's daemon no longer serves, get their compute mode
        reset (with a `compute_mode` setter), unless a spec's daemon wants them exclusive.
        Without this a time-sliced replica would be advertised on a GPU left in
        EXCLUSIVE_PROCESS, where its pods find every CUDA device busy, and a renamed
        resource would run a second daemon on the same GPU."""
        wanted: dict[str, MpsDaemonSpec] = {s.resource: s for s in self._specs}
        exclusive = {u for s in self._specs if not s.mig_uuids for u in s.gpu_uuids}
        found = await asyncio.to_thread(_left_resources, Path(mps_root(root)))
        reset: list[str] = []
        for resource, listening in found:
            spec = wanted.get(resource) or left_behind_spec(root, resource)
            recorded = _recorded(spec) or {}
            gpus = [] if recorded.get("mig_uuids") else _gpu_uuids(recorded.get("gpu_uuids"))
            if resource not in wanted:
                if listening:  # no control socket, no daemon to ask
                    await self.quit_stray(spec)
                self._log.info(
                    "mps-left-behind-daemon-stopped",
                    resource=resource,
                    why="left by the previous agent, not in this config",
                )
                try:
                    await asyncio.to_thread(Path(spec.started_marker).unlink, missing_ok=True)
                except OSError as exc:
                    self._report(f"could not remove {spec.started_marker}: {exc}")
            reset.extend(u for u in gpus if u not in exclusive and u not in reset)
        if self._compute_mode is None:
            return
        for uuid in reset:
            try:
                await self._compute_mode.set_mode(uuid, "DEFAULT")
            except MpsError as exc:
                self._report(f"could not reset compute mode of {uuid} to DEFAULT: {exc}")
            else:
                self._log.info("mps-compute-mode-reset", gpu=uuid, mode="DEFAULT")

    def _launch(self, spec: MpsDaemonSpec) -> None:
        assert self._group is not None
        daemon = _Daemon(spec, self._factory(spec))
        self._daemons[spec.resource] = daemon
        self._readiness.set(spec.resource, False)
        daemon.task = self._group.create_task(
            self._supervise(daemon), name=f"mps-daemon {spec.resource}"
        )

    # -- one daemon --------------------------------------------------------------------------

    async def _supervise(self, daemon: _Daemon) -> None:
        try:
            await self._set_exclusive(daemon)
            running = False
            while not daemon.stop.is_set():
                if not running and await self._found_without_socket(daemon):
                    continue  # it answers again (taken over next) or ended (started next)
                if not running and not await self._start(daemon):
                    await _pause(daemon.stop, self._timings.retry_interval_s)
                    continue
                problem = await self._watch(daemon)
                if problem is None:
                    break
                self._mark(daemon.spec, False)
                running = await self._ride_out_lost_socket(daemon, problem)
                if not running and not daemon.stop.is_set():
                    self._log.warning(
                        "mps-daemon-down",
                        resource=daemon.spec.resource,
                        problem=problem,
                        action="restarting it",
                    )
        finally:
            await self._shutdown(daemon)

    async def _found_without_socket(self, daemon: _Daemon) -> bool:
        """At start (`keep_running`): a daemon left by the previous agent whose socket a pod
        removed still serves its clients; it is waited out like one this agent started."""
        if not self._keep_running:
            return False
        daemon.control.watch_running()
        if not daemon.control.lost_socket():
            return False
        await self._ride_out_lost_socket(daemon, "found so by this agent at its start")
        return True

    async def _ride_out_lost_socket(self, daemon: _Daemon, problem: str) -> bool:
        """A daemon that no longer answers because its control socket was removed (the pipe
        directory is writable from every client container) but whose process still runs is
        not restarted: a restart cuts every client of every pod sharing it, while leaving it
        cuts none (new clients cannot connect, so its replicas stay Unhealthy). Waits until
        it answers again (True: watch it as before), ends (False: restart it) or is stopped
        (True: nothing to restart)."""
        control = daemon.control
        if not control.lost_socket():
            return False
        spec = daemon.spec
        self._report(
            f"MPS daemon for {spec.resource} lost its control socket "
            f"{Path(spec.pipe_dir) / SOCKET_NAME} ({problem}) but still runs: not restarted, "
            "so the clients it serves keep running; its replicas stay Unhealthy until it "
            "answers again or ends (then it is restarted)",
            resource=spec.resource,
        )
        while control.lost_socket():
            if await _pause(daemon.stop, self._timings.health_interval_s):
                return True
        if await self._check(control) is None:
            self._mark(spec, True)
            return True
        return False

    async def _set_exclusive(self, daemon: _Daemon) -> None:
        if self._compute_mode is None or daemon.spec.mig_uuids:
            return  # a MIG daemon: compute mode is the whole GPU's (see MpsDaemonSpec)
        for uuid in daemon.spec.gpu_uuids:
            try:
                await self._compute_mode.set_mode(uuid, "EXCLUSIVE_PROCESS")
            except MpsError as exc:
                self._report(
                    f"could not set compute mode of {uuid} to EXCLUSIVE_PROCESS: {exc}; MPS "
                    "works without it but another non-MPS process could then use the GPU"
                )
            else:
                daemon.exclusive.append(uuid)

    async def _start(self, daemon: _Daemon) -> bool:
        """Start the daemon and apply its limits; False (reported) when any step failed."""
        spec = daemon.spec
        if self._keep_running and await self._check(daemon.control) is None:
            recorded = _recorded(spec)
            if recorded is None or recorded == _settings(spec) or spec.retunable:
                return await self._take_over(daemon, known=recorded is not None)
            self._log.info(
                "mps-daemon-replaced",
                resource=spec.resource,
                reason="runs with other settings",
                recorded=recorded,
                wanted=_settings(spec),
            )
        try:
            _make_dirs(spec)
            # A daemon left by an earlier run would keep stale limits and block `-d`.
            await daemon.control.terminate()
            await self._mount_shm(spec)
            await daemon.control.start_daemon()
            await self._wait_answering(daemon)
            spec = daemon.spec  # a retunable daemon's defaults may have moved meanwhile
            await _configure(daemon.control, spec)
            _record(spec)
        except (MpsError, OSError) as exc:
            if not daemon.stop.is_set():  # given up on purpose: nothing to report
                self._report(
                    f"MPS daemon for {spec.resource} failed to start: {exc}; "
                    f"retrying in {self._timings.retry_interval_s:g} s",
                    resource=spec.resource,
                )
            await _quietly(daemon.control.terminate())
            return False
        self._log.info(
            "mps-daemon-started",
            resource=spec.resource,
            devices=",".join(spec.mig_uuids or spec.gpu_uuids),
            multi_user=spec.multi_user,
            commands="; ".join(spec.commands),
        )
        self._mark(spec, True)
        return True

    async def _take_over(self, daemon: _Daemon, *, known: bool) -> bool:
        """A daemon left running by the previous agent answers with the settings the plan
        wants (`known`), or with settings no record says (one an older agent started): its
        clients keep it. The defaults are sent again (they only shape clients that connect
        from now on), and its process is pinned to tell a lost socket from a dead daemon."""
        spec = daemon.spec
        # running on whatever its shm is: mounting under it now would part it from its clients
        self._shm_users.setdefault(spec.shm_dir, set()).add(spec.resource)
        try:
            await _configure(daemon.control, spec)
            _record(spec)
        except (MpsError, OSError) as exc:
            self._report(
                f"MPS daemon for {spec.resource} answered but not to its limits: {exc}",
                resource=spec.resource,
            )
            await _quietly(daemon.control.terminate())
            return False
        daemon.control.watch_running()
        self._log.info(
            "mps-daemon-taken-over",
            resource=spec.resource,
            settings="as recorded" if known else "not recorded, sent again",
        )
        self._mark(spec, True)
        return True

    async def _wait_answering(self, daemon: _Daemon) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timings.start_timeout_s
        while True:
            problem = await self._check(daemon.control)
            if problem is None:
                return
            if loop.time() >= deadline:
                raise MpsError(f"no answer within {self._timings.start_timeout_s:g} s: {problem}")
            # a daemon removed while it starts (its claim's Prepare was cancelled) is given
            # up at once, not after the whole start timeout
            if await _pause(daemon.stop, self._timings.start_poll_s):
                raise MpsError(f"stopped before it answered: {problem}")

    async def _watch(self, daemon: _Daemon) -> str | None:
        """Health-check until stopped (None) or the daemon fails (what went wrong); each
        round also holds the daemon to its settings (`_hold_settings`)."""
        while not await _pause(daemon.stop, self._timings.health_interval_s):
            problem = await self._check(daemon.control)
            if problem is not None:
                return problem
            await self._hold_settings(daemon)
        return None

    async def _hold_settings(self, daemon: _Daemon) -> None:
        """Read the daemon's defaults back and send them again where they changed.

        The pipe directory is mounted into every client container, so any client can reach
        the control daemon and send `set_default_device_pinned_mem_limit 0 0` or
        `set_default_active_thread_percentage 100`: every MPS server started from then on
        (a new user's, or the next one once its clients are gone) would serve the whole GPU
        to whichever client asks. The drift is logged and reported with what was read; a
        daemon that does not take its settings back is unready (its replicas Unhealthy, no
        new claim on it) until a later round does, and is not restarted: a restart would cut
        the clients it serves."""
        spec = daemon.spec
        try:
            drift = [
                (command, answer, wanted)
                for command, wanted in spec.readbacks
                if (answer := (await daemon.control.send(command)).strip()) != wanted
            ]
        except MpsError:
            return  # the next health command tells a daemon that stopped answering
        if not drift:
            if not self.ready(spec.resource):  # a repair that failed earlier took later
                with contextlib.suppress(OSError):
                    _record(spec)
                self._mark(spec, True)
            return
        seen = "; ".join(f"`{c}` answered {a!r}, expected {w!r}" for c, a, w in drift)
        try:
            await _configure(daemon.control, spec)
        except MpsError as exc:
            self._report(
                f"MPS daemon for {spec.resource}: its settings were changed behind the agent "
                f"({seen}) and it did not take them back ({exc}); unready until it does"
            )
            self._mark(spec, False)
            return
        with contextlib.suppress(OSError):
            _record(spec)
        self._report(
            f"MPS daemon for {spec.resource}: its settings were changed behind the agent "
            f"({seen}); sent again: {'; '.join(spec.commands)}"
        )

    @staticmethod
    async def _check(control: MpsControl) -> str | None:
        try:
            answer = await control.send(HEALTH_COMMAND)
        except MpsError as exc:
            return str(exc)
        try:
            float(answer.strip())
        except ValueError:
            return f"`{HEALTH_COMMAND}` answered {answer!r}, not a number"
        return None

    async def _shutdown(self, daemon: _Daemon) -> None:
        spec = daemon.spec
        if self._keep_running and (self._leaving or not daemon.stop.is_set()):
            # the agent stops (or its loops were cancelled), the pods do not: the next agent
            # takes the daemon over
            self._readiness.forget(spec.resource)
            self._log.info(
                "mps-daemon-left-running", resource=spec.resource, kept_for="the next agent"
            )
            return
        self._mark(spec, False)
        await _quietly(daemon.control.terminate())
        if self._compute_mode is not None:
            for uuid in daemon.exclusive:
                try:
                    await self._compute_mode.set_mode(uuid, "DEFAULT")
                except MpsError as exc:
                    self._report(f"could not reset compute mode of {uuid} to DEFAULT: {exc}")
        daemon.exclusive.clear()
        await self._unmount_shm(spec)
        self._readiness.forget(spec.resource)
        self._log.info("mps-daemon-stopped", resource=spec.resource)

    async def _mount_shm(self, spec: MpsDaemonSpec) -> None:
        """The daemon's shm directory as a size-limited tmpfs, unless another daemon already
        runs on it as it is (it would lose its clients' files); why not, said once. One
        daemon at a time per directory: the second of two starting together finds the first
        one's mount."""
        async with self._shm_locks.setdefault(spec.shm_dir, asyncio.Lock()):
            await self._mount_shm_in_turn(spec)

    async def _mount_shm_in_turn(self, spec: MpsDaemonSpec) -> None:
        users = self._shm_users.setdefault(spec.shm_dir, set())
        others = users - {spec.resource}
        users.add(spec.resource)
        if self._shm is None:
            return
        # a daemon wanted on the same directory whose takeover has not come yet (device
        # plugin mode at an agent's start) may run on it already: its pid file says so
        others |= {
            d.spec.resource
            for d in self._daemons.values()
            if d.spec.shm_dir == spec.shm_dir
            and d.spec.resource != spec.resource
            and await asyncio.to_thread(_runs, d.spec)
        }
        if others:
            why = (
                None
                if await asyncio.to_thread(self._shm.mount_point, spec.shm_dir)
                else (f"the MPS daemon of {', '.join(sorted(others))} runs on it as it is")
            )
        else:
            why = await asyncio.to_thread(self._shm.mount, spec.shm_dir)
        if why is None or why in self._shm_told:
            return
        self._shm_told.add(why)  # once per reason: each DRA claim has a directory of its own
        self._report(
            f"MPS shm directory {spec.shm_dir} is left a plain directory on the node's disk, "
            f"not a size-limited tmpfs: {why} (said once; so are the others while it lasts)"
        )

    async def _unmount_shm(self, spec: MpsDaemonSpec) -> None:
        users = self._shm_users.get(spec.shm_dir, set())
        users.discard(spec.resource)
        if users or self._shm is None:
            return
        self._shm_users.pop(spec.shm_dir, None)
        why = await asyncio.to_thread(unmount, spec.shm_dir)
        if why is not None:
            self._report(f"could not unmount the tmpfs of {spec.shm_dir}: {why}")

    # -- markers and reports -----------------------------------------------------------------

    def _mark(self, spec: MpsDaemonSpec, ready: bool) -> None:
        started = Path(spec.started_marker)
        try:
            if not ready:
                started.unlink(missing_ok=True)
        except OSError as exc:
            self._report(f"could not remove {started}: {exc}")
        if ready:
            self._down_because.pop(spec.resource, None)
        self._readiness.set(spec.resource, ready)

    def _update_markers(self) -> None:
        """`<root>/.ready` for each root whose daemons all answer; removed everywhere else."""
        wanted: dict[Path, bool] = {}
        for daemon in self._daemons.values():
            marker = Path(daemon.spec.ready_marker)
            wanted[marker] = wanted.get(marker, True) and self._readiness.ready(
                daemon.spec.resource
            )
        for marker in self._markers | set(wanted):
            try:
                if wanted.get(marker, False):
                    marker.touch()
                else:
                    marker.unlink(missing_ok=True)
            except OSError as exc:
                self._report(f"could not update {marker}: {exc}")
        self._markers = {m for m, ready in wanted.items() if ready}

    def _report(self, problem: str, *, resource: str | None = None) -> None:
        """Log and keep a problem; one that keeps `resource`'s daemon from serving is also
        its state in `daemons()` until the daemon answers."""
        self._log.warning("mps-problem", resource=resource, message=problem)
        self._problems.append(problem)
        del self._problems[:-50]
        if resource is not None:
            self._down_because[resource] = problem


async def _server_pids(control: MpsControl) -> list[str]:
    """The PIDs of the daemon's running MPS servers (`get_server_list`)."""
    return [p for p in (await control.send("get_server_list")).split() if p.isdigit()]


def _runs(spec: MpsDaemonSpec) -> bool:
    """Whether the daemon's pid file names a running process (never signalled from here)."""
    try:
        pid = int(read_pid_file(Path(spec.pipe_dir) / PID_FILE).strip())
    except (IdentityError, ValueError):
        return False
    return process_alive(pid)


def _make_dirs(spec: MpsDaemonSpec) -> None:
    """The daemon's directories, each checked to stay under the MPS root first: a key is
    derived from a claim UID, and a UID (or a record) holding `..` must create nothing."""
    root = Path(spec.root).resolve()
    for directory in (spec.pipe_dir, spec.log_dir, spec.shm_dir):
        resolved = Path(directory).resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise MpsError(f"{directory} is not under the MPS root {spec.root}: not created")
    pipe = Path(spec.pipe_dir)
    pipe.mkdir(parents=True, exist_ok=True)
    pipe.chmod(0o755)  # clients in containers run as other users; the umask must not narrow it
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    Path(spec.shm_dir).mkdir(parents=True, exist_ok=True)


def _settings(spec: MpsDaemonSpec) -> dict[str, object]:
    """What a running daemon keeps from its start: the GPUs and the limits it was told,
    and (only where set, so a whole-GPU daemon's record reads as it always has) the MIG
    devices it sees and its multi-user mode."""
    settings: dict[str, object] = {
        "gpu_uuids": list(spec.gpu_uuids),
        "gpu_indices": list(spec.gpu_indices),
        "active_thread_percentage": spec.active_thread_percentage,
        "pinned_mem_limits_mib": [list(pair) for pair in spec.pinned_mem_limits_mib],
    }
    if spec.mig_uuids:
        settings["mig_uuids"] = list(spec.mig_uuids)
    if spec.multi_user:
        settings["multi_user"] = True
    return settings


def _record(spec: MpsDaemonSpec) -> None:
    """The started marker, holding the daemon's settings for the next agent: it lies beside
    the pipe directory, not in it, so no client container can write it."""
    marker = Path(spec.started_marker)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(_settings(spec), sort_keys=True) + "\n")
    tmp.replace(marker)


def _recorded(spec: MpsDaemonSpec) -> dict[str, object] | None:
    """The settings the started marker records; None when it records none (missing, empty,
    or written by an agent that only touched it) or cannot be read."""
    try:
        data = read_bounded(Path(spec.started_marker), RECORD_LIMIT)
        found = json.loads(data) if data.strip() else None
    except (IdentityError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _left_resources(root: Path) -> list[tuple[str, bool]]:
    """`<domain>/<name>` of each resource directory under `root` an earlier daemon used
    (a pipe directory or a started marker in it), never through a symlink, and whether a
    control socket is there to ask. The shared shm directory is skipped: client pods write
    there, so what lies in it is theirs."""
    out: list[tuple[str, bool]] = []
    shm = Path(shm_dir(str(root))).name
    try:
        domains = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return out
    for domain in domains:
        if domain.name == shm or not domain.is_dir(follow_symlinks=False):
            continue
        try:
            names = sorted(os.scandir(domain.path), key=lambda e: e.name)
        except OSError:
            continue
        for name in names:
            if not name.is_dir(follow_symlinks=False):
                continue
            here = Path(name.path)
            pipe = here / "pipe"
            if (pipe.is_dir() and not pipe.is_symlink()) or (here / STARTED_MARKER).is_file():
                listening = os.path.lexists(pipe / SOCKET_NAME)
                out.append((f"{domain.name}/{name.name}", listening))
    return out


_GPU_UUID = re.compile(r"GPU-[A-Za-z0-9-]{1,80}")


def _gpu_uuids(value: object) -> list[str]:
    """GPU UUIDs from a started marker: only ones shaped as such reach `nvidia-smi -i`."""
    if not isinstance(value, list):
        return []
    return [u for u in value if isinstance(u, str) and _GPU_UUID.fullmatch(u)]


def _unique(specs: Iterable[MpsDaemonSpec]) -> tuple[MpsDaemonSpec, ...]:
    out = tuple(specs)
    names = [s.resource for s in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"more than one MPS daemon spec for {', '.join(dupes)}")
    return out


async def _pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True when `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def _quietly(step: Awaitable[None]) -> None:
    """Await a best-effort cleanup step; its failure is already visible as a dead daemon."""
    with contextlib.suppress(MpsError, OSError):
        await step


async def _configure(control: MpsControl, spec: MpsDaemonSpec) -> None:
    """Send the daemon its defaults, then read them back: the control program exits 0 even
    when the daemon ignored a setting (`MpsDaemonSpec.readbacks`), and a daemon running
    without its limits would let each client take the whole GPU."""
    for command in spec.commands:
        await control.send(command)
    for command, wanted in spec.readbacks:
        answer = (await control.send(command)).strip()
        if answer != wanted:
            raise MpsError(
                f"the daemon did not take its settings: `{command}` answered "
                f"{answer!r}, expected {wanted!r}"
            )
