"""The simulated GPU backend: a node of modelled GPUs whose health and load tests control.

The agent calls backends from worker threads (`asyncio.to_thread`), and a test injects from
another thread or, through the control directory, from another process; so every piece of
state here sits behind one lock, and health events travel through a thread-safe queue that
hands each event to exactly one `wait_health_event` call.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpuslice.backends.simulated.control import done, reject, take_commands
from gpuslice.backends.simulated.memory import Allocation, GpuMemoryModel, OomDeath
from gpuslice.backends.simulated.node import build_inventory, rebuild_gpu
from gpuslice.backends.simulated.nodespec import NodeSpec, ProcessSpec
from gpuslice.backends.simulated.partition import created, without
from gpuslice.core.caps import CLEARED, LIMIT_MAX, MemoryLimits
from gpuslice.core.devices import Gpu, Inventory, MigDevice
from gpuslice.core.health import HealthEvent
from gpuslice.core.jsontypes import Json
from gpuslice.core.units import MIB
from gpuslice.logs import get_logger
from gpuslice.ports import BackendError, GpuProcess, GpuStatus, MemoryLimitsError

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Load:
    """Telemetry a test set for one GPU; defaults are an idle card."""

    gpu_util_percent: int | None = 0
    memory_util_percent: int | None = 0
    temperature_c: int | None = 34
    power_w: float | None = 25.0


class SimulatedBackend:
    """Implements `gpuslice.ports.GpuBackend` for a `NodeSpec`, plus injection methods."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        control_dir: Path | None = None,
        poll_interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        cgroup_exists: Callable[[str], bool] | None = None,
    ) -> None:
        """`cgroup_exists` tells whether a cgroup path names a live cgroup, for the limits
        calls (None: every path does); tests on a real node pass `os.path.isdir`."""
        self._node = node
        self._inventory = build_inventory(node)
        self._lock = threading.Lock()
        self._control_lock = threading.Lock()
        self._events: queue.Queue[HealthEvent | None] = queue.Queue()
        self._processes: list[GpuProcess] = []
        self._load: dict[str, _Load] = {g.uuid: _Load() for g in self._inventory.gpus}
        self._last_xid: dict[str, int] = {}
        self._closed = False
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._memory: dict[str, GpuMemoryModel] = {}
        """GPU UUID -> the memory of its growing processes (`start_growing`)."""
        self._oom: list[tuple[str, OomDeath]] = []
        self._serial = 0
        """MIG devices created so far: each new one gets a UUID never used before."""
        self.mig_calls: list[tuple[str, str, str]] = []
        """(create | destroy, GPU UUID, MIG UUID) in order, for tests: what was done."""
        self._limits: dict[tuple[str, str], MemoryLimits] = {}
        """(GPU UUID, cgroup path) -> the limits set there (`set_memory_limits`)."""
        self._limits_failure: dict[str, str] = {}
        """GPU UUID -> the NVML error its limit calls fail with (`fail_memory_limits`)."""
        self._limit_calls = 0
        self._cgroup_exists = cgroup_exists
        self._cgroup_of: dict[int, str] = {}
        """pid -> the cgroup (full sysfs path) its memory is charged to, for the limits'
        read-back `used` and the hard limit (`put_in_cgroup`, the control directory)."""
        control = control_dir if control_dir is not None else node.control_dir
        self._events_dir: Path | None = None
        if control is not None:
            self._events_dir = control / "events"
            try:
                self._events_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BackendError(f"simulated control directory {control}: {exc}") from None
        for spec in node.processes:
            self.add_process(self._process_from_spec(spec))
        self._report_unwatched(node)

    @property
    def name(self) -> str:
        return "simulated"

    @property
    def control_dir(self) -> Path | None:
        return None if self._events_dir is None else self._events_dir.parent

    # -- GpuBackend ----------------------------------------------------------------------

    def inventory(self) -> Inventory:
        self._poll_control()
        return self._inventory

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            self._poll_control()
            if self._closed:
                return None
            remaining = deadline - time.monotonic()
            if self._events_dir is not None:
                remaining_wait = min(remaining, self._poll_interval_s)
            else:
                remaining_wait = remaining
            try:
                if remaining_wait > 0:
                    event = self._events.get(timeout=remaining_wait)
                else:
                    event = self._events.get_nowait()
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return None
                continue
            if event is None:  # close() woke us
                return None
            return event

    def processes(self) -> tuple[GpuProcess, ...]:
        self._poll_control()
        with self._lock:
            self._advance_memory()
            return tuple(self._processes)

    def statuses(self) -> tuple[GpuStatus, ...]:
        self._poll_control()
        with self._lock:
            self._advance_memory()
            out = []
            for gpu in self._inventory.gpus:
                used = sum(
                    math.ceil(p.used_memory_bytes / MIB)
                    for p in self._processes
                    if p.gpu_uuid == gpu.uuid and p.used_memory_bytes is not None
                )
                load = self._load[gpu.uuid]
                reported = gpu.memory_reported  # unified memory: NVML gives no figures
                out.append(
                    GpuStatus(
                        gpu_uuid=gpu.uuid,
                        memory_used_mib=used if reported else None,
                        memory_free_mib=max(0, gpu.memory_mib - used) if reported else None,
                        gpu_util_percent=load.gpu_util_percent,
                        memory_util_percent=load.memory_util_percent,
                        temperature_c=load.temperature_c,
                        power_w=load.power_w,
                        last_xid=self._last_xid.get(gpu.uuid),
                    )
                )
            return tuple(out)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._events.put(None)

    def _report_unwatched(self, node: NodeSpec) -> None:
        """The GPUs whose health events NVML would not register, reported as the NVML
        backend reports them at start (`healthEvents` in the node file)."""
        gpus = iter(self._inventory.gpus)
        for group in node.groups:
            for gpu in itertools.islice(gpus, group.count):
                kind = group.health_events
                if kind != "watched":
                    reason = f"registering its events: {_NVML_REFUSAL[kind]} (simulated)"
                    self._events.put(HealthEvent(kind, gpu.uuid, reason=reason))

    # -- injection (tests, demo) ---------------------------------------------------------

    def inject_xid(
        self, gpu_uuid: str, xid: int, gi_id: int | None = None, ci_id: int | None = None
    ) -> None:
        """Deliver an XID as NVML would; gi/ci None means not attributable to an instance."""
        gpu = self._gpu(gpu_uuid)
        if gi_id is not None and not any(m.gi_id == gi_id for m in gpu.mig_devices):
            known = ", ".join(str(m.gi_id) for m in gpu.mig_devices) or "none (MIG off)"
            raise BackendError(f"GPU {gpu_uuid} has no GPU instance {gi_id}; its GI ids: {known}")
        if ci_id is not None and gi_id is None:
            raise BackendError("ci_id needs gi_id: a compute instance lives in a GPU instance")
        with self._lock:
            self._last_xid[gpu.uuid] = xid
        self._events.put(HealthEvent("xid", gpu.uuid, xid=xid, gi_id=gi_id, ci_id=ci_id))

    def inject_recovery(self, gpu_uuid: str) -> None:
        gpu = self._gpu(gpu_uuid)
        self._events.put(HealthEvent("recovered", gpu.uuid))

    def inject_lost(self, gpu_uuid: str) -> None:
        gpu = self._gpu(gpu_uuid)
        self._events.put(HealthEvent("lost", gpu.uuid))

    def add_process(self, process: GpuProcess) -> None:
        """Add (or replace, same pid on the same device) a process with a GPU context."""
        gpu = self._gpu(process.gpu_uuid)
        if process.mig_uuid is not None:
            if not any(m.uuid == process.mig_uuid for m in gpu.mig_devices):
                known = ", ".join(m.uuid for m in gpu.mig_devices) or "none"
                raise BackendError(
                    f"GPU {gpu.uuid} has no MIG device {process.mig_uuid}; its MIG devices: {known}"
                )
            if process.sm_util_percent is not None:
                raise BackendError(
                    f"process {process.pid}: NVML gives no per-process SM utilisation on MIG "
                    "devices; leave sm_util_percent None"
                )
        elif gpu.mig_enabled:
            raise BackendError(
                f"process {process.pid}: GPU {gpu.uuid} is in MIG mode; name the MIG device "
                f"(mig_uuid) it runs on: "
                + (", ".join(m.uuid for m in gpu.mig_devices) or "it has none")
            )
        key = (process.pid, process.gpu_uuid, process.mig_uuid)
        with self._lock:
            self._processes = [p for p in self._processes if (p.pid, p.gpu_uuid, p.mig_uuid) != key]
            self._processes.append(process)

    def remove_process(self, pid: int) -> None:
        """Forget every context of `pid` (it exited)."""
        with self._lock:
            self._processes = [p for p in self._processes if p.pid != pid]
            self._cgroup_of.pop(pid, None)
            for model in self._memory.values():
                model.stop(pid)

    def start_growing(
        self, pid: int, gpu_uuid: str, allocation: Allocation, cgroup: str | None = None
    ) -> None:
        """A process whose memory follows `allocation` over time, and which dies of OOM (is
        removed, and listed by `oom_deaths`) when the GPU cannot hold what it asks for, or
        its cgroup's hard limit (`set_memory_limits`; `cgroup` its full sysfs path)."""
        gpu = self._gpu(gpu_uuid)
        if gpu.mig_enabled:
            raise BackendError(f"process {pid}: growing memory is not simulated on MIG GPUs")
        if not gpu.memory_reported:
            raise BackendError(
                f"process {pid}: growing memory is not simulated on GPU {gpu.uuid}, whose"
                " memory is unified with the host's (no GPU memory figure to run out of)"
            )
        self.remove_process(pid)
        with self._lock:
            self._advance_memory()
            model = self._memory.setdefault(gpu.uuid, GpuMemoryModel(gpu.memory_mib))
            self._sync_fixed(gpu.uuid, model)
            if cgroup is not None:
                self._cgroup_of[pid] = cgroup
            death = model.start(pid, allocation, self._clock(), group=cgroup)
            if death is not None:
                self._record_deaths(gpu.uuid, [death])
                return
            used = model.usage(pid) or 0
            self._processes.append(GpuProcess(pid, gpu.uuid, used * MIB, sm_util_percent=0))

    # -- memory limits (ports.MemoryLimiter) ---------------------------------------------

    def memory_limits_supported(self) -> bool:
        """A simulated driver of branch r615 or later has the calls, as NVIDIA's does."""
        return _driver_branch(self._node.driver_version) >= LIMITS_BRANCH

    def set_memory_limits(self, gpu_uuid: str, cgroup_path: str, limits: MemoryLimits) -> None:
        self._poll_control()
        gpu = self._limits_gpu(gpu_uuid, cgroup_path)
        with self._lock:
            self._limit_calls += 1
            self._put_limits(gpu, cgroup_path, limits)

    def put_limits(self, gpu_uuid: str, cgroup_path: str, limits: MemoryLimits) -> None:
        """Someone other than the agent sets (or clears) a cgroup's limits: a tenant's own
        hook, an operator, a second agent. Not one of the agent's NVML calls (not counted,
        never refused), so a test can make the drift the agent's read-back must repair."""
        gpu = self._gpu(gpu_uuid)
        with self._lock:
            self._put_limits(gpu, cgroup_path, limits)

    def put_in_cgroup(self, pid: int, cgroup_path: str | None) -> None:
        """Charge `pid`'s memory to a cgroup (None: to none), as the driver charges the
        cgroup the process runs in: its read-back `used` and its hard limit count it."""
        with self._lock:
            self._advance_memory()
            if cgroup_path is None:
                self._cgroup_of.pop(pid, None)
            else:
                self._cgroup_of[pid] = cgroup_path

    def _put_limits(self, gpu: Gpu, cgroup_path: str, limits: MemoryLimits) -> None:
        """Under the lock."""
        self._advance_memory()
        key = (gpu.uuid, cgroup_path)
        if limits.cleared:
            self._limits.pop(key, None)
        else:
            self._limits[key] = limits
        model = self._memory.setdefault(gpu.uuid, GpuMemoryModel(gpu.memory_mib))
        self._sync_fixed(gpu.uuid, model)
        hard = None if limits.hard_bytes == LIMIT_MAX else limits.hard_bytes // MIB
        model.set_limits(cgroup_path, limits.soft_bytes // MIB, hard)

    def get_memory_limits(self, gpu_uuid: str, cgroup_path: str) -> MemoryLimits:
        self._poll_control()
        gpu = self._limits_gpu(gpu_uuid, cgroup_path)
        with self._lock:
            self._limit_calls += 1
            self._advance_memory()
            set_ = self._limits.get((gpu.uuid, cgroup_path), CLEARED)
            model = self._memory.get(gpu.uuid)
            if model is None:
                used = self._fixed_groups(gpu.uuid).get(cgroup_path, 0)
            else:
                used = model.group_used_mib(cgroup_path)
            return MemoryLimits(set_.soft_bytes, set_.hard_bytes, used_bytes=used * MIB)

    def remove_cgroup(self, cgroup_path: str) -> None:
        """The cgroup was removed: the driver drops its limits on every GPU."""
        with self._lock:
            for key in [k for k in self._limits if k[1] == cgroup_path]:
                del self._limits[key]
            for model in self._memory.values():
                model.clear_limits(cgroup_path)

    def fail_memory_limits(self, gpu_uuid: str, error: str | None) -> None:
        """Make the limit calls on one GPU fail with an NVML error text (None: succeed)."""
        gpu = self._gpu(gpu_uuid)
        with self._lock:
            if error is None:
                self._limits_failure.pop(gpu.uuid, None)
            else:
                self._limits_failure[gpu.uuid] = error

    @property
    def memory_limit_calls(self) -> int:
        """How many limit calls were made (a test's count of NVML calls)."""
        with self._lock:
            return self._limit_calls

    def _limits_gpu(self, gpu_uuid: str, cgroup_path: str) -> Gpu:
        gpu = self._gpu(gpu_uuid)
        if not self.memory_limits_supported():
            raise MemoryLimitsError(
                "driver-without-call",
                f"simulated driver {self._node.driver_version} has no memory limits call",
            )
        if gpu.mig_enabled:
            raise MemoryLimitsError("mig", f"GPU {gpu.uuid} is in MIG mode: no memory limits")
        with self._lock:
            failure = self._limits_failure.get(gpu.uuid)
        if failure is not None:
            raise MemoryLimitsError("nvml-error", f"GPU {gpu.uuid}: {failure}")
        if self._cgroup_exists is not None and not self._cgroup_exists(cgroup_path):
            raise MemoryLimitsError("gone", f"GPU {gpu.uuid}: no cgroup {cgroup_path}")
        return gpu

    def oom_deaths(self) -> tuple[tuple[str, OomDeath], ...]:
        """(GPU UUID, death) for every simulated process that died of out-of-memory."""
        self._poll_control()
        with self._lock:
            self._advance_memory()
            return tuple(self._oom)

    def _fixed(self, gpu_uuid: str) -> list[GpuProcess]:
        """Under the lock: the GPU's processes of a fixed size (not grown by its model)."""
        growing = self._memory.get(gpu_uuid)
        return [
            p
            for p in self._processes
            if p.gpu_uuid == gpu_uuid
            and p.used_memory_bytes is not None
            and (growing is None or p.pid not in growing.procs)
        ]

    def _fixed_mib(self, gpu_uuid: str) -> int:
        return sum(math.ceil((p.used_memory_bytes or 0) / MIB) for p in self._fixed(gpu_uuid))

    def _fixed_groups(self, gpu_uuid: str) -> dict[str, int]:
        """Under the lock: cgroup -> the MiB its fixed-size processes hold on the GPU."""
        out: dict[str, int] = {}
        for p in self._fixed(gpu_uuid):
            group = self._cgroup_of.get(p.pid)
            if group is not None:
                out[group] = out.get(group, 0) + math.ceil((p.used_memory_bytes or 0) / MIB)
        return out

    def _sync_fixed(self, gpu_uuid: str, model: GpuMemoryModel) -> None:
        model.fixed_mib = self._fixed_mib(gpu_uuid)
        model.fixed_groups = self._fixed_groups(gpu_uuid)

    def _advance_memory(self) -> None:
        """Under the lock: grow, and kill what runs out of memory."""
        now = self._clock()
        for uuid, model in self._memory.items():
            self._sync_fixed(uuid, model)
            died = model.advance(now)
            self._record_deaths(uuid, died)
            self._processes = [
                replace(p, used_memory_bytes=(model.usage(p.pid) or 0) * MIB)
                if p.gpu_uuid == uuid and p.pid in model.procs
                else p
                for p in self._processes
            ]

    def _record_deaths(self, uuid: str, died: list[OomDeath]) -> None:
        for death in died:
            log.warning(
                "sim-oom",
                pid=death.pid,
                gpu=uuid,
                wanted_mib=death.wanted_mib,
                free_mib=death.free_mib,
                reason=death.reason,
            )
            self._oom.append((uuid, death))
        dead = {d.pid for d in died}
        for pid in dead:
            self._cgroup_of.pop(pid, None)
        if dead:
            self._processes = [
                p for p in self._processes if not (p.gpu_uuid == uuid and p.pid in dead)
            ]

    def set_status(
        self,
        gpu_uuid: str,
        *,
        gpu_util_percent: int | None = None,
        memory_util_percent: int | None = None,
        temperature_c: int | None = None,
        power_w: float | None = None,
    ) -> None:
        """Set telemetry for `statuses()`; arguments left None keep their current value."""
        gpu = self._gpu(gpu_uuid)
        for label, pct in (
            ("gpu_util_percent", gpu_util_percent),
            ("memory_util_percent", memory_util_percent),
        ):
            if pct is not None and not 0 <= pct <= 100:
                raise BackendError(f"{label}: expected 0..100, got {pct}")
        with self._lock:
            load = self._load[gpu.uuid]
            changes: Json = {
                k: v
                for k, v in (
                    ("gpu_util_percent", gpu_util_percent),
                    ("memory_util_percent", memory_util_percent),
                    ("temperature_c", temperature_c),
                    ("power_w", power_w),
                )
                if v is not None
            }
            self._load[gpu.uuid] = replace(load, **changes)

    # -- ports.MigPartitioner ------------------------------------------------------------

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigDevice:
        self._poll_control()
        return self._create_mig(gpu_uuid, profile, start)

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str, gi_id: int, ci_id: int) -> None:
        self._poll_control()
        self._destroy_mig(gpu_uuid, mig_uuid, gi_id, ci_id)

    def _create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigDevice:
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            self._serial += 1
            mig = created(gpu, profile, start, self._serial)
            self._replace_migs(gpu, (*gpu.mig_devices, mig))
            self.mig_calls.append(("create", gpu.uuid, mig.uuid))
        self._events.put(HealthEvent("inventory-changed", gpu.uuid))
        return mig

    def _destroy_mig(self, gpu_uuid: str, mig_uuid: str, gi_id: int, ci_id: int) -> None:
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            self._replace_migs(gpu, without(gpu, mig_uuid, gi_id, ci_id))
            self._processes = [p for p in self._processes if p.mig_uuid != mig_uuid]
            self.mig_calls.append(("destroy", gpu.uuid, mig_uuid))
        self._events.put(HealthEvent("inventory-changed", gpu.uuid))

    def live_mig_devices(self, gpu_uuid: str) -> tuple[MigDevice, ...]:
        self._poll_control()
        with self._lock:
            return self._gpu(gpu_uuid).mig_devices

    def _replace_migs(self, gpu: Gpu, migs: tuple[MigDevice, ...]) -> None:
        """Under the lock: `gpu` with `migs` as its MIG devices, in index order."""
        new = dataclasses.replace(gpu, mig_devices=tuple(sorted(migs, key=lambda m: m.index)))
        gpus = tuple(new if g.uuid == gpu.uuid else g for g in self._inventory.gpus)
        self._inventory = dataclasses.replace(self._inventory, gpus=gpus)

    # -- helpers -------------------------------------------------------------------------

    def set_mig(self, gpu_uuid: str, enabled: bool, layout: str | None) -> None:
        """Switch a GPU's MIG mode and/or repartition it, as an operator does on a live node;
        the agent sees it on its next inventory read."""
        gpu = self._gpu(gpu_uuid)
        if enabled and layout is None:
            layout = ""  # MIG on, no instances yet
        new = rebuild_gpu(self._node, gpu.index, mig_enabled=enabled, mig_layout=layout)
        with self._lock:
            gpus = tuple(new if g.uuid == gpu.uuid else g for g in self._inventory.gpus)
            self._inventory = dataclasses.replace(self._inventory, gpus=gpus)
        self._events.put(HealthEvent("inventory-changed", gpu.uuid))

    def resolve_gpu(self, ref: str | int) -> Gpu:
        """A GPU by UUID or index (the control directory and node files accept both)."""
        if isinstance(ref, int) and not isinstance(ref, bool):
            if 0 <= ref < len(self._inventory.gpus):
                return self._inventory.gpus[ref]
            raise BackendError(
                f"no GPU index {ref}: this node has indices 0..{len(self._inventory.gpus) - 1}"
            )
        return self._gpu(str(ref))

    def resolve_mig(self, gpu: Gpu, ref: str | int) -> MigDevice:
        for m in gpu.mig_devices:
            if (isinstance(ref, int) and m.index == ref) or m.uuid == ref:
                return m
        known = ", ".join(f"{m.index} ({m.uuid})" for m in gpu.mig_devices) or "none"
        raise BackendError(f"GPU {gpu.index} has no MIG device {ref!r}; its MIG devices: {known}")

    def _gpu(self, uuid: str) -> Gpu:
        gpu = self._inventory.gpu_by_uuid(uuid)
        if gpu is None:
            known = ", ".join(g.uuid for g in self._inventory.gpus)
            raise BackendError(f"no GPU {uuid!r} on this simulated node; its GPUs: {known}")
        return gpu

    def _process_from_spec(self, spec: ProcessSpec) -> GpuProcess:
        gpu = self.resolve_gpu(spec.gpu)
        mig = None if spec.mig is None else self.resolve_mig(gpu, spec.mig).uuid
        return GpuProcess(
            pid=spec.pid,
            gpu_uuid=gpu.uuid,
            used_memory_bytes=None if spec.used_memory_mib is None else spec.used_memory_mib * MIB,
            mig_uuid=mig,
            sm_util_percent=spec.sm_util_percent,
            is_mps_client=spec.mps,
        )

    def _poll_control(self) -> None:
        if self._events_dir is None:
            return
        # Serialised so that a caller returning after this saw every command written before.
        with self._control_lock:
            for path, command in take_commands(self._events_dir):
                try:
                    self._apply(command)
                except (BackendError, KeyError, TypeError, ValueError) as exc:
                    reject(path, str(exc))
                else:
                    done(path)

    def _apply(self, command: Json) -> None:
        kind = command["kind"]
        if kind == "remove_process":
            self.remove_process(_int(command, "pid"))
            return
        if kind == "cgroup_removed":
            self.remove_cgroup(_str(command, "cgroup"))
            return
        gpu = self.resolve_gpu(_ref(command, "gpu"))
        if kind == "xid":
            self.inject_xid(
                gpu.uuid, _int(command, "xid"), _opt_int(command, "giId"), _opt_int(command, "ciId")
            )
        elif kind == "recovered":
            self.inject_recovery(gpu.uuid)
        elif kind == "lost":
            self.inject_lost(gpu.uuid)
        elif kind == "add_process":
            mig = command.get("mig")
            self.add_process(
                self._process_from_spec(
                    ProcessSpec(
                        pid=_int(command, "pid"),
                        gpu=gpu.uuid,
                        mig=None if mig is None else _ref(command, "mig"),
                        used_memory_mib=_opt_int(command, "usedMemoryMiB"),
                        sm_util_percent=_opt_int(command, "smUtil"),
                        mps=bool(command.get("mps", False)),
                    )
                )
            )
            self.put_in_cgroup(_int(command, "pid"), _opt_str(command, "cgroup"))
        elif kind == "mig":
            self.set_mig(gpu.uuid, _bool(command, "enabled"), _opt_str(command, "layout"))
        elif kind == "create_mig":  # an operator's `nvidia-smi mig -cgi P -C` at a placement
            profile = _opt_str(command, "profile")
            if profile is None:
                raise BackendError("profile: expected a MIG profile name")
            self._create_mig(gpu.uuid, profile, _int(command, "start"))
        elif kind == "destroy_mig":
            mig = self.resolve_mig(gpu, _ref(command, "mig"))
            self._destroy_mig(gpu.uuid, mig.uuid, mig.gi_id, mig.ci_id)
        elif kind == "grow_process":
            target = command.get("targetMiB")
            self.start_growing(
                _int(command, "pid"),
                gpu.uuid,
                Allocation(
                    start_mib=_opt_int(command, "startMiB") or 0,
                    rate_mib_s=_number(command, "rateMiBPerS"),
                    target_mib=None if target is None else _int(command, "targetMiB"),
                    burst_mib=_opt_int(command, "burstMiB") or 0,
                    burst_every_s=_number(command, "burstEveryS"),
                    burst_s=_number(command, "burstS"),
                ),
                cgroup=_opt_str(command, "cgroup"),
            )
        elif kind == "set_limits":
            hard = _opt_int(command, "hardMiB")
            soft = _int(command, "softMiB")
            if soft < 0 or (hard is not None and hard < 0):
                raise BackendError(f"limits: expected sizes >= 0, got {soft!r}, {hard!r}")
            limits = MemoryLimits(soft * MIB, LIMIT_MAX if hard is None else hard * MIB)
            self.put_limits(gpu.uuid, _str(command, "cgroup"), limits)
        elif kind == "clear_limits":
            self.put_limits(gpu.uuid, _str(command, "cgroup"), CLEARED)
        elif kind == "fail_limits":
            self.fail_memory_limits(gpu.uuid, _opt_str(command, "error"))
        elif kind == "set_status":
            power = command.get("powerW")
            if power is not None and not isinstance(power, int | float):
                raise BackendError(f"powerW: expected a number, got {power!r}")
            self.set_status(
                gpu.uuid,
                gpu_util_percent=_opt_int(command, "gpuUtil"),
                memory_util_percent=_opt_int(command, "memoryUtil"),
                temperature_c=_opt_int(command, "temperatureC"),
                power_w=None if power is None else float(power),
            )
        else:
            raise BackendError(
                f"unknown command kind {kind!r}; accepted: xid, recovered, lost, add_process, "
                "grow_process, remove_process, set_status, mig, create_mig, destroy_mig, "
                "set_limits, clear_limits, fail_limits, cgroup_removed"
            )


LIMITS_BRANCH = 615
"""The first driver branch with `nvmlDeviceSetMemoryLimits_v1` (CUDA 13.4)."""


_NVML_REFUSAL = {"unmonitored": "Unknown Error", "unsupported": "Not Supported"}
"""The NVML error a group's `healthEvents` stands for when its GPUs' events are registered."""


def _driver_branch(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _bool(command: Json, key: str) -> bool:
    value = command.get(key)
    if not isinstance(value, bool):
        raise BackendError(f"{key}: expected true or false, got {value!r}")
    return value


def _opt_str(command: Json, key: str) -> str | None:
    value = command.get(key)
    if value is not None and not isinstance(value, str):
        raise BackendError(f"{key}: expected a string, got {value!r}")
    return value


def _str(command: Json, key: str) -> str:
    value = command.get(key)
    if not isinstance(value, str) or not value:
        raise BackendError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _int(command: Json, key: str) -> int:
    value = command.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BackendError(f"{key}: expected a whole number, got {value!r}")
    return value


def _number(command: Json, key: str) -> float:
    value = command.get(key, 0) or 0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BackendError(f"{key}: expected a number >= 0, got {value!r}")
    return float(value)


def _opt_int(command: Json, key: str) -> int | None:
    return None if command.get(key) is None else _int(command, key)


def _ref(command: Json, key: str) -> str | int:
    value = command.get(key)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BackendError(f"{key}: expected an index or a UUID, got {value!r}")
    return value
