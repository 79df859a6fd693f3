"""The DRA driver's sharing on the node: the claims' MPS control daemons (a share daemon
sized by every share on its GPU), a whole GPU's compute mode around its daemon and the
time-slice interval a claim asks for, each step applied under its GPUs' locks and recorded
before it may take effect, and their undo from the record.

`ClaimSharing` owns the MPS daemon manager, the compute-mode and interval setters and the
claims' daemon specs: no other piece of the driver (`agent.dra_state`) starts, retunes or
quits a daemon or sets a GPU, so what a daemon serves is decided in one place. It reads
the driver's state for the claims that hold the GPUs and for their locks."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from gpuslice.agent.dra_state import DriverState, _described
from gpuslice.aio.to_the_end import to_the_end
from gpuslice.core.dra.claims import ClaimError, daemon_spec
from gpuslice.core.dra.names import BadName, check_path_component
from gpuslice.core.dra.preparation import (
    SHARES_RECORD,
    Preparation,
    SetComputeMode,
    SetInterval,
    StartDaemon,
    share_daemon_spec,
    with_compute_modes,
)
from gpuslice.core.dra.prepared import AppliedSharing, PreparedClaim
from gpuslice.core.mps import MpsDaemonSpec, control_socket_too_long
from gpuslice.host.checkpoint_file import boot_time
from gpuslice.logs import get_logger
from gpuslice.mps import MpsDaemonManager, MpsError
from gpuslice.mps.control import PID_FILE, process_alive
from gpuslice.mps.identity import IdentityError, read_pid_file
from gpuslice.mps.shm import unmount
from gpuslice.ports import ComputeModeSetter, TimesliceSetter

log = get_logger("gpuslice.dra.driver")


class ClaimSharing:
    """Applies and undoes the claims' sharing steps on the node."""

    def __init__(
        self,
        state: DriverState,
        *,
        mps: MpsDaemonManager | None,
        timeslice: TimesliceSetter | None,
        compute_mode: ComputeModeSetter | None,
    ) -> None:
        self._state = state
        self._mps = mps
        self._timeslice = timeslice
        self._compute_mode = compute_mode
        self._daemons: dict[str, MpsDaemonSpec] = {}
        """The claims' MPS daemons, by key: what the manager is told to run."""

    def _served(self, spec: MpsDaemonSpec, *, without: str = "") -> MpsDaemonSpec:
        """A share daemon sized by every share on its GPU, of the claims prepared or being
        prepared (but `without` and those leaving), as `share_daemon_spec` says; any other
        daemon as it is."""
        if not spec.retunable:
            return spec
        uses = [
            u
            for ref, held in self._state.holders()
            if ref.uid != without and ref.uid not in self._state.leaving
            for u in held
        ]
        snap = self._state.snapshot()
        gpu = None if snap is None else snap.inventory.gpu_by_uuid(spec.gpu_uuids[0])
        memory = None if gpu is None else gpu.memory_mib or None
        return share_daemon_spec(
            self._state.settings.mps_root, spec.gpu_uuids[0], spec.gpu_indices[0], uses, memory
        )

    def _spec_of(self, claim: PreparedClaim, applied: AppliedSharing) -> MpsDaemonSpec | None:
        if not applied.mps_key:
            return None
        indices = self._state.gpu_indices()
        gpus = [(u, indices[u]) for u in applied.gpu_uuids if u in indices]
        if not gpus:
            return None
        if applied.strategy == SHARES_RECORD:
            uuid, index = gpus[0]
            return self._served(share_daemon_spec(self._state.settings.mps_root, uuid, index, ()))
        return daemon_spec(
            applied.mps_key,
            self._state.settings.mps_root,
            gpus,
            thread_percentage=applied.thread_percentage,
            limits_mib=dict(applied.limits_mib),
            mig_uuids=applied.mig_uuids,
            multi_user=applied.multi_user,
        )

    async def apply(self, prepared: Preparation, applied: list[AppliedSharing]) -> None:
        """Carry out the claim's steps in order, each under the locks of the GPUs it
        touches, keeping each one's record once it may have taken effect."""
        for step in prepared.steps:
            if isinstance(step, StartDaemon):
                async with self._state.gpu_locks.holding(step.spec.gpu_uuids):
                    # recorded first: a daemon that never answers is still one to stop
                    applied.append(step.record)
                    await self._start_daemon(self._served(step.spec))
            elif isinstance(step, SetComputeMode):
                async with self._state.gpu_locks.holding([step.gpu_uuid]):
                    await self._set_exclusive(step, applied)
            else:
                async with self._state.gpu_locks.holding([step.gpu_uuid]):
                    await self._set_interval(step, applied)

    async def _set_interval(self, step: SetInterval, applied: list[AppliedSharing]) -> None:
        if self._timeslice is None:
            raise ClaimError(
                f"{step.source}: this node cannot set time-slice intervals "
                "(no nvidia-smi configured); remove timeSlicingConfig.interval"
            )
        timeout = self._state.settings.timeslice_timeout_s
        applied.append(step.record)  # a set cut short may have taken effect: reset it then
        try:
            await asyncio.wait_for(
                self._timeslice.set_timeslice(step.gpu_uuid, step.interval), timeout
            )
        except MpsError as exc:
            applied.pop()  # nvidia-smi refused: nothing to reset
            raise ClaimError(
                f"{step.source}: GPU {step.gpu_uuid} does not take time-slice interval "
                f"{step.interval}: {exc}"
            ) from None
        except TimeoutError:
            raise ClaimError(
                f"{step.source}: setting time-slice interval {step.interval} on GPU "
                f"{step.gpu_uuid} did not finish within {timeout:g} s"
            ) from None

    async def _set_exclusive(self, step: SetComputeMode, applied: list[AppliedSharing]) -> None:
        """EXCLUSIVE_PROCESS before the GPU's MPS daemon starts, recorded before it is set
        (a crash in between leaves a record the next start undoes). MPS works without it,
        as NVIDIA's driver has it: a refusal is told, and the claim goes on."""
        if self._compute_mode is None:
            return
        applied.append(step.record)
        try:
            await asyncio.wait_for(
                self._compute_mode.set_mode(step.gpu_uuid, "EXCLUSIVE_PROCESS"),
                self._state.settings.compute_mode_timeout_s,
            )
        except (MpsError, TimeoutError) as exc:
            if isinstance(exc, MpsError):
                applied.pop()  # nvidia-smi refused: nothing to reset
            log.warning(
                "dra-compute-mode-not-set",
                gpu=step.gpu_uuid,
                error=_described(exc),
                effect="MPS runs without it; another process may open the GPU",
            )

    async def _reset_compute_mode(self, gpu_uuid: str) -> None:
        assert self._compute_mode is not None
        try:
            await asyncio.wait_for(
                self._compute_mode.set_mode(gpu_uuid, "DEFAULT"),
                self._state.settings.compute_mode_timeout_s,
            )
        except (MpsError, TimeoutError) as exc:
            log.warning("dra-compute-mode-reset-failed", gpu=gpu_uuid, error=_described(exc))
        else:
            log.info("dra-compute-mode-reset", gpu=gpu_uuid)

    async def _start_daemon(self, spec: MpsDaemonSpec) -> None:
        if self._mps is None:
            raise ClaimError("MPS is not available on this node (no MPS control program)")
        if problem := control_socket_too_long(spec.pipe_dir):
            raise ClaimError(problem)
        if self._daemons.get(spec.resource) != spec:
            self._daemons[spec.resource] = spec
            await to_the_end(self._mps.reconfigure(tuple(self._daemons.values())))
        await self._wait_ready(spec.resource)

    async def _wait_ready(self, key: str) -> None:
        assert self._mps is not None
        timeout = self._state.settings.mps_ready_timeout_s
        deadline = time.monotonic() + timeout
        version = self._mps.version
        while not self._mps.ready(key):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                problems = "; ".join(self._mps.problems[-2:])
                raise ClaimError(
                    f"MPS control daemon {key} did not answer within {timeout:g} s"
                    + (f" ({problems})" if problems else "")
                )
            try:
                version = await asyncio.wait_for(self._mps.wait_changed(version), remaining)
            except TimeoutError:
                continue

    async def undo(self, claim_uid: str, applied: Sequence[AppliedSharing]) -> None:
        """Undo what the record says, best effort: a step that fails is logged, never
        blocks the rest (the claim is gone for the kubelet either way). Runs under the
        locks of every GPU it touches, so a claim starting a daemon on one of them either
        finished (and keeps the daemon) or starts after the stop.

        A daemon of the claim's that no one supervises (its Prepare was cut short by a
        crash) is quit here, and the GPUs' compute modes are reset after the daemons went.
        While the record is incomplete, a GPU's share daemon and compute mode may serve a
        claim the record lacks: only the claim's own daemons and their GPUs are undone."""
        gpus = [u for a in applied for u in a.gpu_uuids]
        async with self._state.gpu_locks.holding(gpus):
            still_used = self._daemons_used_by_others(claim_uid)
            stopped: list[str] = []
            strays: list[str] = []
            retuned = False
            for a in applied:
                if a.mps_key and a.mps_key not in still_used:
                    if a.mps_key in self._daemons:
                        del self._daemons[a.mps_key]
                        stopped.append(a.mps_key)
                    elif a.mps_key not in strays and self._undoable(claim_uid, a.mps_key):
                        strays.append(a.mps_key)
                elif a.mps_key in self._daemons and self._daemons[a.mps_key].retunable:
                    # the shares left on the GPU may hold less than this one did
                    spec = self._served(self._daemons[a.mps_key], without=claim_uid)
                    retuned = retuned or spec != self._daemons[a.mps_key]
                    self._daemons[a.mps_key] = spec
                if a.interval is not None and a.interval != 0 and self._timeslice is not None:
                    for uuid in a.gpu_uuids:
                        await self._reset_interval(uuid)
            if self._mps is not None:
                if stopped or retuned:
                    await self._mps.reconfigure(tuple(self._daemons.values()))
                for key in strays:
                    await self._mps.quit_stray(self._stray_spec(key))
            # after the daemons: the mode goes back once no MPS server holds the GPU
            if self._compute_mode is not None:
                keep = self._exclusive_for_others(claim_uid)
                if not self._state.complete:
                    own = {
                        u
                        for a in applied
                        if self._undoable(claim_uid, a.mps_key)
                        for u in a.gpu_uuids
                    }
                    keep |= set(gpus) - own
                for uuid in dict.fromkeys(
                    u for a in applied if a.compute_mode for u in a.gpu_uuids
                ):
                    if uuid not in keep:
                        await self._reset_compute_mode(uuid)
            for key in (*stopped, *strays):
                await asyncio.to_thread(self._remove_daemon_dir, key)

    def _applied_by_others(self, claim_uid: str) -> list[AppliedSharing]:
        """What the other claims applied: prepared ones (but those leaving) and those being
        prepared."""
        applied = [
            a
            for uid, c in self._state.claims.items()
            if uid != claim_uid and uid not in self._state.leaving
            for a in c.applied
        ]
        applied.extend(
            a
            for uid, flight in self._state.in_flight.items()
            if uid != claim_uid
            for a in flight.sharing
        )
        return applied

    def _daemons_used_by_others(self, claim_uid: str) -> set[str]:
        return {a.mps_key for a in self._applied_by_others(claim_uid) if a.mps_key}

    def _undoable(self, claim_uid: str, mps_key: str) -> bool:
        """Whether the daemon `mps_key` serves no claim but `claim_uid`'s, as far as the
        record can tell: its own (`<uid>-<digest>`), or any while the record is complete."""
        return bool(mps_key) and (self._state.complete or mps_key.startswith(f"{claim_uid}-"))

    def _exclusive_for_others(self, claim_uid: str) -> set[str]:
        """GPUs another claim (prepared, or being prepared) set to EXCLUSIVE_PROCESS: MPS
        shares of one GPU share its daemon, and the mode stays until the last one goes."""
        return {
            u for a in self._applied_by_others(claim_uid) if a.compute_mode for u in a.gpu_uuids
        }

    async def _reset_interval(self, gpu_uuid: str) -> None:
        assert self._timeslice is not None
        try:
            await asyncio.wait_for(
                self._timeslice.set_timeslice(gpu_uuid, 0), self._state.settings.timeslice_timeout_s
            )
        except (MpsError, TimeoutError) as exc:
            log.warning("dra-timeslice-reset-failed", gpu=gpu_uuid, error=_described(exc))

    def _remove_daemon_dir(self, key: str) -> None:
        """`<mps root>/<key>`: the stopped daemon's pipe, log and shm directories. Left in
        place (and said so) while its pid file says a daemon may still be running there."""
        try:
            base = Path(self._state.settings.mps_root) / check_path_component(key, "MPS daemon key")
        except BadName as exc:
            log.warning("dra-mps-dir-kept", error=str(exc))
            return
        pid_file = base / "pipe" / PID_FILE
        if _daemon_may_run(pid_file):
            log.warning("dra-mps-dir-kept", dir=str(base), reason="its daemon may still run")
            return
        # a stray's tmpfs (its agent gone before it stopped the daemon) goes with the directory
        why = unmount(str(base / "shm"))
        if why is not None:
            log.warning("dra-mps-shm-unmount-failed", dir=str(base / "shm"), error=why)
        shutil.rmtree(base, ignore_errors=True)

    def upgraded(self, claims: Mapping[str, PreparedClaim]) -> dict[str, PreparedClaim]:
        """The recorded claims as this node's steps would record them now: where it sets
        compute modes, records from before the compute mode was a step say so of their
        daemons' GPUs, which were set."""
        if self._compute_mode is None:
            return dict(claims)
        return {u: replace(c, applied=with_compute_modes(c.applied)) for u, c in claims.items()}

    def take_over(self, claims: Iterable[PreparedClaim]) -> None:
        """The recorded claims' daemons, left running across the agent's restart: this
        driver's again (run by `resume`, once the record is settled)."""
        for claim in claims:
            for applied in claim.applied:
                spec = self._spec_of(claim, applied)
                if spec is not None:
                    self._daemons[spec.resource] = spec

    async def resume(self) -> None:
        """Quit the daemons no recorded claim holds (only while the record is complete),
        and supervise those taken over."""
        if self._mps is None:
            return
        if self._state.complete:
            await self._quit_strays()
        if self._daemons:
            await self._mps.reconfigure(self._daemons.values())

    async def quit_unrecorded(self, claim_uid: str) -> None:
        """The claim MPS daemons (`<uid>-<digest>`) of a claim the record does not hold,
        quit and their directories removed (`agent.dra_unprepare`)."""
        if self._mps is None:
            return
        keys = await asyncio.to_thread(self.daemon_dirs)
        for key in keys:
            if not key.startswith(f"{claim_uid}-") or key in self._daemons:
                continue
            await self._mps.quit_stray(self._stray_spec(key))
            await asyncio.to_thread(self._remove_daemon_dir, key)
            log.info("dra-mps-unrecorded-quit", claim_uid=claim_uid, daemon=key)

    async def _quit_strays(self) -> None:
        """Daemons are left running across agent restarts; one whose claim the record no
        longer holds (a corrupt record, a Prepare cut short) would serve nobody forever."""
        assert self._mps is not None
        for key in await asyncio.to_thread(self.daemon_dirs):
            if key not in self._daemons:
                await self._mps.quit_stray(self._stray_spec(key))

    def _stray_spec(self, key: str) -> MpsDaemonSpec:
        """The paths of claim daemon `key`, enough to ask one no spec supervises to quit."""
        return daemon_spec(key, self._state.settings.mps_root, [])

    def daemon_dirs(self) -> list[str]:
        """The claim MPS daemon directories (`<mps root>/<key>/pipe`) on the node."""
        root = Path(self._state.settings.mps_root)
        try:
            return sorted(p.name for p in root.iterdir() if (p / "pipe").is_dir())
        except FileNotFoundError:
            return []


def _daemon_may_run(pid_file: Path) -> bool:
    """Whether the daemon a pid file names may still run. Not when there is none, nor when
    it was written before this boot (nothing survives a reboot, and the pid may since be
    another process's), nor when no process has that pid. What cannot be told (a file that
    cannot be read, or holds no pid) counts as running: its directory is kept. Asked only
    once the daemon was told to quit, so a clock stepped after the file was written costs
    at most the directory of a daemon that was stopping anyway."""
    try:
        written = pid_file.lstat().st_mtime
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if written < boot_time():
        return False
    try:  # the MPS adapter's own bounded reader: a pod can write this directory
        pid = int(read_pid_file(pid_file).strip())
    except (IdentityError, ValueError):
        return True
    return pid > 0 and process_alive(pid)
