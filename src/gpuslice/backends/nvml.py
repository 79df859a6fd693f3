"""The NVML backend: the node's real GPUs, through nvidia-ml-py (`pynvml`).

`pynvml` is imported inside functions only, so every other part of gpuslice (and every
machine without an NVIDIA driver) can import this module; a node without the library or the
driver gets a BackendError naming the likely cause instead of an ImportError or a ctypes
traceback.

Choices worth knowing:
- Health follows NVIDIA's device plugin: events XidCriticalError plus double/single-bit ECC,
  each intersected with what the device supports, registered on parent handles (NVML has no
  per-MIG-instance registration). Only XIDs become `xid` events; ECC events are logged and
  skipped, as NVIDIA does (a DBE is followed by its own XID). GI/CI ids of 0xFFFFFFFF mean
  "not attributable" and become None. A GPU whose registration fails is reported
  `unmonitored` (one NVML calls too old for the events, `unsupported`), named in the log.
- Recovery: NVIDIA never marks a device healthy again. We take a GpuRecoveryAction event
  whose action is NONE (the driver says the GPU needs nothing further) as `recovered`; other
  actions (reset, reboot, drain) leave the device unhealthy and are logged.
- A device that NVML reports lost (GpuIsLost from a wait, or a GpuUnavailableError event)
  becomes `lost`. Any other wait failure, or an event whose device cannot be named, marks
  every GPU `lost`, as NVIDIA marks every device unhealthy in that case.
- Events are waited for by a daemon thread of the backend's own (`_watch`) in long slices
  and handed to `wait_health_event` through a condition, so an idle daemon wakes once per
  WAIT_SLICE_S for NVML and `close()` (and the process exit) never wait on an NVML wait.
- SM counts of whole GPUs: NVML's attribute query is for MIG devices; for a whole GPU we use
  it where the driver answers, else CUDA cores / cores per SM of the architecture.
- MIG profile names are rebuilt from the GI profile (see `backends.mignames`).
- Unified-memory GPUs (GB10 / DGX Spark, Jetson Thor) answer NOT_SUPPORTED to the memory
  query: the GPU is listed with `memory_mib` 0 and its statuses carry no memory figures, as
  NVIDIA's device plugin, GFD and DRA driver tolerate it (logged once per GPU); the
  lost-GPU probe then asks for the UUID instead of the memory.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
from itertools import combinations
from pathlib import Path
from typing import Any

from gpuslice.backends import nvml_mig
from gpuslice.backends.mignames import mig_profile_name
from gpuslice.backends.nvml_limits import NvmlMemoryLimiter
from gpuslice.core.devices import Gpu, GpuUuid, Inventory, Link, MigDevice, MigUuid, P2PLevel
from gpuslice.core.gpumodels import MigGeometry
from gpuslice.core.health import NO_INSTANCE, HealthEvent, HealthEventKind
from gpuslice.core.migcaps import access_files, char_major, device_file_minor
from gpuslice.core.units import MIB
from gpuslice.logs import get_logger
from gpuslice.ports import BackendError, GpuProcess, GpuStatus, MigGone, MigNotOurs

log = get_logger(__name__)


EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_XID = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000
EVENT_MIG_CONFIG_CHANGE = 0x100
"""`nvmlEventMigConfigChange`: GPU or compute instances created or destroyed."""
RECOVERY_ACTION_NONE = 0

WAIT_SLICE_S = 10.0
"""Longest single NVML wait of the watcher thread. Nothing can cut a wait short from another
thread, so each slice's end wakes an idle daemon for nothing; it was 0.5 s while the agent's
own thread waited here and `close()` had to wait for it (two wake-ups a second, idle). Now
the watcher is a daemon thread that neither `close()` nor the process exit waits for, and the
slice only bounds how long after `close()` the watcher frees the event set and NVML.

Measured on an H200 (driver 580.159.04): a second `nvmlInit` in the same process waits
while the closed backend's watcher is still inside its wait, so opening a backend right
after closing one took 9.8 s there (0.02 s otherwise). The agent opens one backend for its
life; a tool or test that reopens pays up to one slice."""

FAILED_WAIT_PAUSE_S = 1.0
"""Pause after a failed wait, so a wait that keeps failing at once cannot spin the watcher."""

_TOPOLOGY: dict[int, P2PLevel] = {
    0: "same-board",
    10: "single-switch",
    20: "multi-switch",
    30: "host-bridge",
    40: "same-cpu",
    50: "cross-cpu",
}

_CORES_PER_SM: dict[int, int] = {7: 64, 8: 64, 9: 128, 10: 128, 12: 128}
"""CUDA cores per SM by compute-capability major; 8.6+ (GA10x, Ada) has 128, see below."""

# GPU instance profile enum indices (nvml.h) whose names carry a suffix.
_PROFILE_SUFFIX: dict[int, str] = {
    0x7: "+me",
    0xA: "+gfx",
    0xB: "+gfx",
    0xC: "+gfx",
    0xD: "-me",
    0xE: "-me",
    0xF: "+me.all",
    0x10: "+me.all",
    0x11: "+gfx",
}


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise BackendError(
            f"NVML not available: the nvidia-ml-py package cannot be imported ({exc})"
        ) from None
    return pynvml


def translate_event(
    event_type: int, event_data: int, gi_id: int, ci_id: int, gpu_uuid: str
) -> HealthEvent | None:
    """One NVML event as a HealthEvent, or None for events that change nothing."""
    if event_type & EVENT_XID:
        return HealthEvent(
            "xid",
            gpu_uuid,
            xid=event_data,
            gi_id=None if gi_id == NO_INSTANCE else gi_id,
            ci_id=None if ci_id == NO_INSTANCE else ci_id,
        )
    if event_type & EVENT_GPU_UNAVAILABLE:
        return HealthEvent("lost", gpu_uuid)
    if event_type & EVENT_RECOVERY_ACTION and event_data == RECOVERY_ACTION_NONE:
        return HealthEvent("recovered", gpu_uuid)
    if event_type & EVENT_MIG_CONFIG_CHANGE:
        return HealthEvent("inventory-changed", gpu_uuid)
    return None


def cores_per_sm(capability: tuple[int, int]) -> int:
    major, minor = capability
    if major == 8 and minor == 0:
        return 64  # GA100
    if major == 8:
        return 128  # GA10x, AD10x
    return _CORES_PER_SM.get(major, 128)


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """`00000000:07:00.0` -> `0000:07:00.0`, the form /sys and lspci use."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def numa_from_sysfs(sys_root: Path, nvml_bus_id: str) -> int | None:
    try:
        text = (sys_root / "bus/pci/devices" / sysfs_bus_id(nvml_bus_id) / "numa_node").read_text()
        node = int(text.strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def pcie_root_from_sysfs(sys_root: Path, nvml_bus_id: str) -> str | None:
    """The PCIe root complex (`pci0000:64`) above the GPU, as Kubernetes' own helper
    (`deviceattribute.GetPCIeRootAttributeByPCIBusID`, which NVIDIA's driver uses) finds
    it: `/sys/bus/pci/devices/<bus id>` links to `/sys/devices/pci<domain>:<bus>/.../<bus
    id>`, and the first directory under `devices` is the root. None when the link is
    missing or does not have that shape (a VM without the hierarchy): the attribute is then
    left out, as NVIDIA's driver leaves it out, rather than guessed."""
    try:
        bdf = sysfs_bus_id(nvml_bus_id)
        link = sys_root / "bus/pci/devices" / bdf
        target = os.readlink(link)
    except (OSError, ValueError):
        return None
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    devices = os.path.normpath(sys_root / "devices")
    parts = os.path.relpath(resolved, devices).split(os.sep)
    if len(parts) < 2 or parts[-1] != bdf or not _PCIE_ROOT.match(parts[0]):
        return None
    return parts[0]


def pci_class_from_sysfs(sys_root: Path, nvml_bus_id: str) -> int | None:
    """The 24-bit PCI class code (`0x030200`), read from sysfs as GFD does (go-nvlib's
    nvpci): NVML does not report it. None when the file is missing or unreadable."""
    try:
        text = (sys_root / "bus/pci/devices" / sysfs_bus_id(nvml_bus_id) / "class").read_text()
        return int(text.strip(), 16)
    except (OSError, ValueError):
        return None


def read_cap_minors(
    gpu_minor: int, gi_id: int, ci_id: int, root: Path = Path("/")
) -> tuple[int, int] | None:
    """A MIG device's capability minors from the driver's access files, as NVIDIA's DRA
    driver reads them (`core.migcaps`); None when they cannot be read (logged): the DRA
    driver then refuses claims of that MIG device, which a container could not open."""
    minors: list[int] = []
    for path in access_files(gpu_minor, gi_id, ci_id):
        try:
            text = (root / path.lstrip("/")).read_text(encoding="utf-8", errors="replace")
            minors.append(device_file_minor(text))
        except (OSError, ValueError) as exc:
            log.warning("mig-caps-unreadable", file=path, error=str(exc))
            return None
    return minors[0], minors[1]


def read_caps_major(root: Path = Path("/")) -> int | None:
    """The `nvidia-caps` character major from `/proc/devices`; None when unreadable."""
    try:
        return char_major((root / "proc/devices").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None


class NvmlBackend:
    """Implements `gpuslice.ports.GpuBackend` over NVML."""

    def __init__(self, *, sys_root: Path = Path("/sys")) -> None:
        nv = _import_pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise BackendError(
                f"NVML not available: {exc} (no NVIDIA driver on this machine?)"
            ) from None
        self._nv = nv
        self._sys_root = sys_root
        self._closed = False
        self._released = False
        self._wait_lock = threading.Lock()  # held by whoever is calling into the event set
        self._state_lock = threading.Lock()
        self._arrived = threading.Condition()  # guards _pending and _closed
        self._pending: collections.deque[HealthEvent] = collections.deque()
        self._last_xid: dict[str, int] = {}
        self._stop = threading.Event()
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._unified: set[str] = set()
        self._geometry: dict[int, MigGeometry | None] = {}
        """GPU index -> its MIG profiles and placements, read once in MIG mode (fixed by
        the hardware and the driver)."""
        self._mig_lock = threading.Lock()
        """One MIG creation or destruction at a time: NVML serialises them per GPU anyway,
        and reading back the device a creation made must not see another's."""
        """GPUs whose memory query answered NOT_SUPPORTED (unified memory), told once."""
        try:
            self._enumerate()
        except BackendError:
            nv.nvmlShutdown()
            raise
        self._event_set: Any = None
        self._start_health()
        if self._event_set is not None:
            threading.Thread(target=self._watch, name="nvml-health", daemon=True).start()

    @property
    def name(self) -> str:
        return "nvml"

    # -- GpuBackend ----------------------------------------------------------------------

    def inventory(self) -> Inventory:
        nv = self._nv
        try:
            driver = str(nv.nvmlSystemGetDriverVersion())
            cuda = int(nv.nvmlSystemGetCudaDriverVersion())
            gpus = tuple(self._gpu(i, h) for i, h in enumerate(self._handles))
            links = self._links(gpus)
        except nv.NVMLError as exc:
            raise BackendError(f"NVML inventory failed: {exc}") from None
        return Inventory(gpus=gpus, driver_version=driver, cuda_driver_version=cuda, links=links)

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        """Events come from the watcher thread (`_watch`); `close()` wakes this at once."""
        with self._arrived:
            self._arrived.wait_for(lambda: self._pending or self._closed, max(0.0, timeout_s))
            return self._pending.popleft() if self._pending else None

    def processes(self) -> tuple[GpuProcess, ...]:
        nv = self._nv
        out: list[GpuProcess] = []
        for handle in self._handles:
            try:
                uuid = str(nv.nvmlDeviceGetUUID(handle))
                mig_on = self._mig_mode(handle)[0]
            except nv.NVMLError as exc:
                log.warning("nvml-processes-failed", error=str(exc))
                continue
            if mig_on:
                for mig_handle in self._mig_handles(handle):
                    try:
                        mig_uuid = str(nv.nvmlDeviceGetUUID(mig_handle))
                    except nv.NVMLError:
                        continue
                    out.extend(self._device_processes(mig_handle, uuid, mig_uuid, {}))
            else:
                out.extend(self._device_processes(handle, uuid, None, self._sm_util(handle)))
        return tuple(out)

    def statuses(self) -> tuple[GpuStatus, ...]:
        nv = self._nv
        out: list[GpuStatus] = []
        for handle in self._handles:
            try:
                uuid = str(nv.nvmlDeviceGetUUID(handle))
                mem = self._memory_info(handle, uuid)
            except nv.NVMLError as exc:
                log.warning("nvml-status-failed", error=str(exc))
                continue
            util = self._optional(nv.nvmlDeviceGetUtilizationRates, handle)
            temp = self._optional(nv.nvmlDeviceGetTemperature, handle, 0)  # NVML_TEMPERATURE_GPU
            power_mw = self._optional(nv.nvmlDeviceGetPowerUsage, handle)
            with self._state_lock:
                last_xid = self._last_xid.get(uuid)
            out.append(
                GpuStatus(
                    gpu_uuid=uuid,
                    memory_used_mib=None if mem is None else int(mem.used) // MIB,
                    memory_free_mib=None if mem is None else int(mem.free) // MIB,
                    gpu_util_percent=None if util is None else int(util.gpu),
                    memory_util_percent=None if util is None else int(util.memory),
                    temperature_c=None if temp is None else int(temp),
                    power_w=None if power_mw is None else int(power_mw) / 1000.0,
                    last_xid=last_xid,
                )
            )
        return tuple(out)

    def memory_limiter(self) -> NvmlMemoryLimiter:
        """Per-cgroup memory limits on these GPUs (`backends.nvml_limits`), sharing this
        backend's NVML session."""
        return NvmlMemoryLimiter(self._nv, self._limits_handle)

    def _limits_handle(self, gpu_uuid: str) -> tuple[Any, bool]:
        handle = self._nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        return handle, self._mig_mode(handle)[0]

    def close(self) -> None:
        with self._arrived:
            if self._closed:
                return
            self._closed = True
            self._arrived.notify_all()
        self._stop.set()
        # The event set must not be freed (nor NVML shut down) under a thread waiting on
        # it. When the watcher is in a wait, it frees both as it leaves (within
        # WAIT_SLICE_S); closing does not wait for it, so shutdown stays prompt.
        if self._wait_lock.acquire(blocking=False):
            try:
                self._release()
            finally:
                self._wait_lock.release()

    def _release(self) -> None:
        """Free the event set and shut NVML down, once; the caller holds `_wait_lock`."""
        if self._released:
            return
        self._released = True
        if self._event_set is not None:
            try:
                self._nv.nvmlEventSetFree(self._event_set)
            except self._nv.NVMLError as exc:
                log.debug("nvml-eventset-free-failed", error=str(exc))
            self._event_set = None
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError as exc:
            log.debug("nvml-shutdown-failed", error=str(exc))

    # -- inventory -----------------------------------------------------------------------

    def _enumerate(self) -> None:
        """Handles and UUIDs by index, once: the set of GPUs only changes with the driver.

        UUIDs are kept so that a GPU that stopped answering can still be named.
        """
        nv = self._nv
        try:
            count = int(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [str(nv.nvmlDeviceGetUUID(h)) for h in handles]
        except nv.NVMLError as exc:
            raise BackendError(f"NVML cannot list GPUs: {exc}") from None
        self._handles, self._uuids = handles, uuids

    def _gpu(self, index: int, handle: Any) -> Gpu:
        nv = self._nv
        uuid = GpuUuid(str(nv.nvmlDeviceGetUUID(handle)))
        mem = self._memory_info(handle, uuid)
        memory_mib = 0 if mem is None else int(mem.total) // MIB
        pci = nv.nvmlDeviceGetPciInfo(handle)
        bus_id = str(pci.busId)
        major, minor_cc = nv.nvmlDeviceGetCudaComputeCapability(handle)
        capability = (int(major), int(minor_cc))
        minor = self._optional(nv.nvmlDeviceGetMinorNumber, handle)
        gpu_minor = index if minor is None else int(minor)
        current, pending = self._mig_mode(handle)
        mig_capable = self._mig_capable(handle)
        mig_devices = (
            self._mig_devices(index, handle, uuid, memory_mib, gpu_minor) if current else ()
        )
        if current and index not in self._geometry:
            self._geometry[index] = self._read_geometry(handle, memory_mib)
        return Gpu(
            index=index,
            uuid=uuid,
            product_name=str(nv.nvmlDeviceGetName(handle)),
            memory_mib=memory_mib,
            multiprocessors=self._multiprocessors(handle, capability),
            compute_capability=capability,
            pci_bus_id=bus_id,
            minor=gpu_minor,
            numa_node=self._numa(handle, bus_id),
            pcie_root=pcie_root_from_sysfs(self._sys_root, bus_id),
            mig_capable=mig_capable,
            mig_enabled=current,
            mig_pending=pending,
            mig_devices=mig_devices,
            pci_device_id=int(pci.pciDeviceId),
            pci_class=pci_class_from_sysfs(self._sys_root, bus_id),
            mig_geometry=self._geometry.get(index),
        )

    def _read_geometry(self, handle: Any, memory_mib: int) -> MigGeometry | None:
        try:
            return nvml_mig.read_geometry(self._nv, handle, memory_mib)
        except self._nv.NVMLError as exc:
            log.warning("nvml-mig-geometry-failed", error=str(exc))
            return None

    # -- ports.MigPartitioner ----------------------------------------------------------

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigDevice:
        index, handle = self._handle_of(gpu_uuid)
        gpu = self._gpu(index, handle)
        if not gpu.mig_enabled:
            raise BackendError(
                f"GPU {index} ({gpu_uuid}) is not in MIG mode: no MIG device can be created on "
                "it (gpuslice never changes MIG mode)"
            )
        found = gpu.mig_geometry.profile(profile) if gpu.mig_geometry is not None else None
        if found is None:
            raise BackendError(f"GPU {index} ({gpu_uuid}) has no MIG profile {profile!r}")
        with self._mig_lock:
            gi_id, ci_id = nvml_mig.create(self._nv, handle, found, start)
            for mig in self.live_mig_devices(gpu_uuid):
                if (mig.gi_id, mig.ci_id) == (gi_id, ci_id):
                    return mig
        raise BackendError(
            f"GPU {index}: GI {gi_id} CI {ci_id} was created but NVML lists no MIG device for it"
        )

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str, gi_id: int, ci_id: int) -> None:
        _index, handle = self._handle_of(gpu_uuid)
        with self._mig_lock:
            live = [
                m for m in self.live_mig_devices(gpu_uuid) if (m.gi_id, m.ci_id) == (gi_id, ci_id)
            ]
            if not live:
                raise MigGone(f"GPU {gpu_uuid} has no GI {gi_id} CI {ci_id} any more")
            if live[0].uuid != mig_uuid:
                raise MigNotOurs(
                    f"GPU {gpu_uuid}: GI {gi_id} CI {ci_id} is {live[0].uuid}, not "
                    f"{mig_uuid}: left alone"
                )
            nvml_mig.destroy(self._nv, handle, gi_id, ci_id)

    def live_mig_devices(self, gpu_uuid: str) -> tuple[MigDevice, ...]:
        index, handle = self._handle_of(gpu_uuid)
        try:
            memory_mib = int(self._nv.nvmlDeviceGetMemoryInfo(handle).total) // MIB
            minor = self._optional(self._nv.nvmlDeviceGetMinorNumber, handle)
            return self._mig_devices(
                index, handle, GpuUuid(gpu_uuid), memory_mib, index if minor is None else int(minor)
            )
        except self._nv.NVMLError as exc:
            raise BackendError(f"reading GPU {gpu_uuid}'s MIG devices: {exc}") from None

    def _handle_of(self, gpu_uuid: str) -> tuple[int, Any]:
        for index, uuid in enumerate(self._uuids):
            if uuid == gpu_uuid:
                return index, self._handles[index]
        raise BackendError(f"no GPU {gpu_uuid} on this node")

    def _multiprocessors(self, handle: Any, capability: tuple[int, int]) -> int:
        attrs = self._optional(self._nv.nvmlDeviceGetAttributes, handle)
        if attrs is not None and int(attrs.multiprocessorCount) > 0:
            return int(attrs.multiprocessorCount)
        cores = self._optional(self._nv.nvmlDeviceGetNumGpuCores, handle)
        if cores is None:
            return 0
        return int(cores) // cores_per_sm(capability)

    def _numa(self, handle: Any, bus_id: str) -> int | None:
        node = self._optional(getattr(self._nv, "nvmlDeviceGetNumaNodeId", None), handle)
        if node is not None and int(node) >= 0:
            return int(node)
        return numa_from_sysfs(self._sys_root, bus_id)

    def _mig_mode(self, handle: Any) -> tuple[bool, bool]:
        mode = self._optional(self._nv.nvmlDeviceGetMigMode, handle)
        if mode is None:
            return (False, False)
        current, pending = mode
        return (int(current) == 1, int(pending) == 1)

    def _mig_capable(self, handle: Any) -> bool:
        try:
            self._nv.nvmlDeviceGetMigMode(handle)
        except self._nv.NVMLError:
            return False
        return True

    def _mig_handles(self, handle: Any) -> list[Any]:
        nv = self._nv
        count = self._optional(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out = []
        for j in range(int(count)):
            try:
                out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
            except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
                continue
        return out

    def _mig_devices(
        self, index: int, handle: Any, uuid: GpuUuid, gpu_mib: int, gpu_minor: int
    ) -> tuple[MigDevice, ...]:
        nv = self._nv
        suffix_by_profile_id = self._profile_suffixes(handle)
        out: list[MigDevice] = []
        count = self._optional(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        caps_major = read_caps_major() if count else None
        for j in range(int(count)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
                continue
            attrs = nv.nvmlDeviceGetAttributes(mig)
            gi_id = int(nv.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(nv.nvmlDeviceGetComputeInstanceId(mig))
            start, size, profile_id = self._gi_placement(handle, gi_id)
            gi_slices = int(attrs.gpuInstanceSliceCount)
            memory_mib = int(attrs.memorySizeMB)
            out.append(
                MigDevice(
                    uuid=MigUuid(str(nv.nvmlDeviceGetUUID(mig))),
                    parent_uuid=uuid,
                    parent_index=index,
                    index=j,
                    profile=mig_profile_name(
                        gi_slices=gi_slices,
                        ci_slices=int(attrs.computeInstanceSliceCount),
                        instance_mib=memory_mib,
                        gpu_mib=gpu_mib,
                        suffix=suffix_by_profile_id.get(profile_id, ""),
                    ),
                    gi_id=gi_id,
                    ci_id=ci_id,
                    memory_mib=memory_mib,
                    multiprocessors=int(attrs.multiprocessorCount),
                    slices_gi=gi_slices,
                    slices_ci=int(attrs.computeInstanceSliceCount),
                    placement_start=start,
                    placement_size=size,
                    engines_copy=int(attrs.sharedCopyEngineCount),
                    engines_decoder=int(attrs.sharedDecoderCount),
                    engines_encoder=int(attrs.sharedEncoderCount),
                    engines_jpeg=int(attrs.sharedJpegCount),
                    engines_ofa=int(attrs.sharedOfaCount),
                    cap_minors=read_cap_minors(gpu_minor, gi_id, ci_id),
                    cap_major=caps_major,
                )
            )
        return tuple(out)

    def _gi_placement(self, handle: Any, gi_id: int) -> tuple[int, int, int]:
        """(start, size, profile id) of a GPU instance; (-1, 0, -1) when NVML will not say.

        Reading a GPU instance needs privileges the plugin normally has; without them the
        placement is unknown rather than guessed.
        """
        nv = self._nv
        try:
            info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        except nv.NVMLError as exc:
            log.debug("nvml-gi-info-failed", gi=gi_id, error=str(exc))
            return (-1, 0, -1)
        return (int(info.placement.start), int(info.placement.size), int(info.profileId))

    def _profile_suffixes(self, handle: Any) -> dict[int, str]:
        """Profile ID -> name suffix (`+me`, ...), from the enum index each ID belongs to."""
        nv = self._nv
        out: dict[int, str] = {}
        for enum_index, suffix in _PROFILE_SUFFIX.items():
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum_index)
            except nv.NVMLError:
                continue
            out[int(info.id)] = suffix
        return out

    def _links(self, gpus: tuple[Gpu, ...]) -> tuple[Link, ...]:
        nv = self._nv
        handles = dict(zip((g.uuid for g in gpus), self._handles, strict=True))
        direct = {g.uuid: self._nvlink_peers(handles[g.uuid]) for g in gpus}
        bus_of = {g.uuid: sysfs_bus_id(g.pci_bus_id) for g in gpus}
        links: list[Link] = []
        for a, b in combinations(gpus, 2):
            ha, hb = handles[a.uuid], handles[b.uuid]
            level = self._optional(nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
            p2p: P2PLevel
            if level is not None:
                p2p = _TOPOLOGY.get(int(level), "cross-cpu")
            else:
                p2p = "same-cpu" if a.numa_node == b.numa_node else "cross-cpu"
            peers_a = direct[a.uuid]
            nvlinks = peers_a.get(bus_of[b.uuid], 0)
            if nvlinks == 0 and sum(peers_a.values()) > 0:
                # Through an NVSwitch the remote end is the switch, not the peer: count the
                # GPU's active links when NVML says the pair can talk over NVLink.
                status = self._optional(nv.nvmlDeviceGetP2PStatus, ha, hb, 2)  # CAPS_INDEX_NVLINK
                if status is not None and int(status) == 0:
                    nvlinks = sum(peers_a.values())
            links.append(Link(a=a.uuid, b=b.uuid, p2p=p2p, nvlinks=nvlinks))
        return tuple(links)

    def _nvlink_peers(self, handle: Any) -> dict[str, int]:
        """Active NVLinks by remote PCI bus id (sysfs form)."""
        nv = self._nv
        peers: dict[str, int] = collections.Counter()
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if int(nv.nvmlDeviceGetNvLinkState(handle, link)) != 1:
                    continue
                remote = str(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nv.NVMLError:
                continue
            try:
                peers[sysfs_bus_id(remote)] += 1
            except ValueError:
                continue
        return dict(peers)

    # -- processes -----------------------------------------------------------------------

    def _device_processes(
        self, handle: Any, gpu_uuid: str, mig_uuid: str | None, sm_util: dict[int, int]
    ) -> list[GpuProcess]:
        nv = self._nv
        compute = self._optional(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
        mps = self._optional(nv.nvmlDeviceGetMPSComputeRunningProcesses, handle) or []
        mps_pids = {int(p.pid) for p in mps}
        out: dict[int, GpuProcess] = {}
        for p in [*compute, *mps]:
            pid = int(p.pid)
            used = p.usedGpuMemory
            out[pid] = GpuProcess(
                pid=pid,
                gpu_uuid=gpu_uuid,
                used_memory_bytes=None if used is None else int(used),
                mig_uuid=mig_uuid,
                sm_util_percent=sm_util.get(pid),
                is_mps_client=pid in mps_pids,
            )
        return list(out.values())

    def _sm_util(self, handle: Any) -> dict[int, int]:
        """Latest SM utilisation per pid from NVML's sample buffer (not on MIG)."""
        samples = self._optional(self._nv.nvmlDeviceGetProcessUtilization, handle, 0) or []
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            pid, ts = int(s.pid), int(s.timeStamp)
            if pid not in latest or ts > latest[pid][0]:
                latest[pid] = (ts, int(s.smUtil))
        return {pid: util for pid, (_, util) in latest.items()}

    # -- health --------------------------------------------------------------------------

    def _start_health(self) -> None:
        """Register the health events of every GPU; one whose registration fails is queued
        as `unmonitored` (NVIDIA's device plugin marks it unhealthy, its DRA driver taints it
        `unmonitored`), one NVML calls too old for them as `unsupported`, each logged by
        UUID: a GPU nobody watches must not pass for a healthy one."""
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("nvml-health-disabled", reason=str(exc))
            self._unwatched(self._uuids, "unsupported", f"no NVML event set: {exc}")
            return
        wanted = (
            EVENT_XID
            | EVENT_DBE
            | EVENT_SBE
            | EVENT_GPU_UNAVAILABLE
            | EVENT_RECOVERY_ACTION
            | EVENT_MIG_CONFIG_CHANGE
        )
        not_supported = getattr(nv, "NVMLError_NotSupported", ())
        registered = 0
        for handle, uuid in zip(self._handles, self._uuids, strict=True):
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(handle))
                mask = wanted & supported
                if not mask & EVENT_XID:
                    log.warning("nvml-health-unsupported", gpu=uuid, message="too old?")
                    self._unwatched([uuid], "unsupported", "the GPU reports no XID events")
                    continue
                nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
                registered += 1
            except not_supported as exc:
                log.warning("nvml-health-unsupported", gpu=uuid, error=str(exc))
                self._unwatched([uuid], "unsupported", f"registering its events: {exc}")
            except nv.NVMLError as exc:
                log.warning("nvml-health-register-failed", gpu=uuid, error=str(exc))
                self._unwatched([uuid], "unmonitored", f"registering its events: {exc}")
        if registered == 0:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(event_set)
            return
        self._event_set = event_set

    def _unwatched(self, uuids: list[str], kind: HealthEventKind, reason: str) -> None:
        """Queue the GPUs whose health cannot be watched, for the agent's health loop."""
        with self._arrived:
            self._pending.extend(HealthEvent(kind, u, reason=reason) for u in uuids)
            self._arrived.notify_all()

    def _watch(self) -> None:
        """The health thread: waits on the event set in slices until closed, then frees it.

        A thread of its own (a daemon thread) rather than the caller of `wait_health_event`,
        because an NVML wait cannot be interrupted: the agent's thread and the process exit
        would otherwise wait for the slice to end, which forced short slices.
        """
        while True:
            with self._wait_lock:
                if self._closed:
                    self._release()
                    return
                events, failed = self._wait_once(WAIT_SLICE_S)
            if events:
                with self._arrived:
                    self._pending.extend(events)
                    self._arrived.notify_all()
            if failed:
                self._stop.wait(FAILED_WAIT_PAUSE_S)

    def _wait_once(self, timeout_s: float) -> tuple[list[HealthEvent], bool]:
        """The events of one wait, and whether it failed; the caller holds `_wait_lock`."""
        nv = self._nv
        try:
            data = nv.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except nv.NVMLError_Timeout:
            return [], False
        except nv.NVMLError as exc:
            return self._lost_after(exc), True
        try:
            uuid = str(nv.nvmlDeviceGetUUID(data.device))
        except nv.NVMLError as exc:
            return self._lost_after(exc), True
        event_type, event_data = int(data.eventType), int(data.eventData)
        event = translate_event(
            event_type, event_data, int(data.gpuInstanceId), int(data.computeInstanceId), uuid
        )
        if event is None:
            log.info("nvml-event-skipped", gpu=uuid, type=f"{event_type:#x}", data=event_data)
        elif event.kind == "xid" and event.xid is not None:
            with self._state_lock:
                self._last_xid[uuid] = event.xid
        return ([] if event is None else [event]), False

    def _lost_after(self, exc: Exception) -> list[HealthEvent]:
        """Queue `lost` for the GPUs that stopped answering; all of them if none can be told.

        A failed wait does not say which device failed, so each GPU is asked once.
        """
        nv = self._nv
        not_supported = getattr(nv, "NVMLError_NotSupported", ())
        lost = []
        for handle, uuid in zip(self._handles, self._uuids, strict=True):
            try:
                try:
                    nv.nvmlDeviceGetMemoryInfo(handle)
                except not_supported:
                    # A unified-memory GPU does not answer the memory query (which says
                    # nothing about it being lost): its UUID query reaches it instead.
                    nv.nvmlDeviceGetUUID(handle)
            except nv.NVMLError_GpuIsLost:
                lost.append(uuid)
            except nv.NVMLError:
                continue
        who = lost or list(self._uuids)
        log.error("nvml-health-failed", error=str(exc), lost=",".join(who))
        return [HealthEvent("lost", uuid) for uuid in who]

    # -- helpers -------------------------------------------------------------------------

    def _memory_info(self, handle: Any, uuid: str) -> Any:
        """NVML's memory info, or None where the GPU has none to give: a unified-memory GPU
        (GB10, Jetson Thor) answers NOT_SUPPORTED, which must not fail the inventory (the
        node would publish nothing) nor the statuses. Told once per GPU, not per sample."""
        nv = self._nv
        not_supported = getattr(nv, "NVMLError_NotSupported", None)
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError as exc:
            if not_supported is None or not isinstance(exc, not_supported):
                raise
        if uuid not in self._unified:
            self._unified.add(uuid)
            log.warning(
                "nvml-memory-not-supported",
                gpu=uuid,
                reason="unified memory: no memory label, capacity, MPS limit or guard here",
            )
        return None

    def _optional(self, fn: Any, *args: Any) -> Any:
        """Call an NVML query a device may not support; None when it does not answer."""
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None
        except self._nv.NVMLLibraryMismatchError:
            return None
