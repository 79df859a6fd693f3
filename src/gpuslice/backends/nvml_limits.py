"""Per-cgroup GPU memory limits through NVML (`gpuslice.ports.MemoryLimiter`).

`nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1` came with driver branch r615
(CUDA 13.4); nvidia-ml-py binds both and looks the symbol up on the first call, so on an
older driver the call raises `NVMLError` with `NVML_ERROR_FUNCTION_NOT_FOUND`. That is
probed once, at start, by reading the limits of the agent's own cgroup on the first GPU
(a read changes nothing): the function is there or not for the whole driver.

The structs take the cgroup's full sysfs path as `nameSpace` (bytes for ctypes' `c_char_p`)
and sizes in bytes. MIG handles are refused by the driver; this adapter refuses them before
asking, so the reason is `mig` rather than whatever error code the driver picks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuslice.core.caps import MemoryLimits
from gpuslice.logs import get_logger
from gpuslice.ports import MemoryLimitsError

log = get_logger(__name__)

FUNCTION_NOT_FOUND = 13
"""`NVML_ERROR_FUNCTION_NOT_FOUND`: the driver's library has no such symbol."""
NOT_FOUND = 6
"""`NVML_ERROR_NOT_FOUND`."""


class NvmlMemoryLimiter:
    """`MemoryLimiter` over an initialised pynvml module and the backend's handles.

    `handle_of(uuid)` gives the device handle of a whole GPU and whether the GPU is in MIG
    mode; the NVML backend passes its own lookup so NVML stays initialised once."""

    def __init__(
        self,
        nv: Any,
        handle_of: Callable[[str], tuple[Any, bool]],
        probe_cgroup: str = "/sys/fs/cgroup",
    ) -> None:
        self._nv = nv
        self._handle_of = handle_of
        self._probe_cgroup = probe_cgroup
        self._supported: bool | None = None

    def memory_limits_supported(self) -> bool:
        if self._supported is None:
            self._supported = self._probe()
        return self._supported

    def _probe(self) -> bool:
        nv = self._nv
        if not hasattr(nv, "nvmlDeviceGetMemoryLimits_v1"):
            return False  # a binding older than the call (nvidia-ml-py < 13.615)
        try:
            uuid = str(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0)))
        except nv.NVMLError:
            return False
        try:
            self.get_memory_limits(uuid, self._probe_cgroup)
        except MemoryLimitsError as exc:
            # Only a missing function says "no"; a refusal of this cgroup or this GPU (MIG)
            # says the function exists.
            return exc.refusal != "driver-without-call"
        return True

    def set_memory_limits(self, gpu_uuid: str, cgroup_path: str, limits: MemoryLimits) -> None:
        nv = self._nv
        handle = self._handle(gpu_uuid)
        struct = nv.c_nvmlSetMemoryLimits_v1_t()
        struct.nameSpace = cgroup_path.encode()
        struct.softLimit = limits.soft_bytes
        struct.hardLimit = limits.hard_bytes
        try:
            nv.nvmlDeviceSetMemoryLimits_v1(handle, struct)
        except nv.NVMLError as exc:
            raise _error(exc, gpu_uuid, cgroup_path) from None

    def get_memory_limits(self, gpu_uuid: str, cgroup_path: str) -> MemoryLimits:
        nv = self._nv
        handle = self._handle(gpu_uuid)
        struct = nv.c_nvmlGetMemoryLimits_v1_t()
        struct.nameSpace = cgroup_path.encode()
        try:
            nv.nvmlDeviceGetMemoryLimits_v1(handle, struct)
        except nv.NVMLError as exc:
            raise _error(exc, gpu_uuid, cgroup_path) from None
        return MemoryLimits(
            int(struct.softLimit), int(struct.hardLimit), used_bytes=int(struct.currentUsed)
        )

    def _handle(self, gpu_uuid: str) -> Any:
        try:
            handle, mig = self._handle_of(gpu_uuid)
        except self._nv.NVMLError as exc:
            raise _error(exc, gpu_uuid, "") from None
        if mig:
            raise MemoryLimitsError("mig", f"GPU {gpu_uuid} is in MIG mode: no memory limits")
        return handle


def _error(exc: Any, gpu_uuid: str, cgroup_path: str) -> MemoryLimitsError:
    code = getattr(exc, "value", None)
    where = f"GPU {gpu_uuid}" + (f", cgroup {cgroup_path}" if cgroup_path else "")
    if code == FUNCTION_NOT_FOUND:
        return MemoryLimitsError(
            "driver-without-call", f"{where}: the driver has no memory limits call ({exc})"
        )
    if code == NOT_FOUND:
        return MemoryLimitsError("gone", f"{where}: {exc}")
    return MemoryLimitsError("nvml-error", f"{where}: {exc}")
