"""STAND-IN for nvidia-ml-py, for measuring the NVML path's idle footprint only.

Not a test double of record and not NVML: `bench/bench_idle.py --nvml-stand-in` puts this
directory first on the daemon's PYTHONPATH so that `gpuslice.backends.nvml` starts and idles
on a machine without a GPU. Nothing in the package or the tests can import it (it lives
under `bench/`, which is on no path but that one process's).

It models 8 idle H100 80GB HBM3 (SXM, NVSwitch, MIG off, no processes) well enough for the
backend's calls: the names, return shapes and error classes follow pynvml's source
(`nvmlEventSetWait_v2` returns a `c_nvmlEventData_t`, errors are `NVMLError(code)` mapped to
`NVMLError_<Name>` subclasses). Every call returns at once except `nvmlEventSetWait_v2`,
which sleeps for its timeout (releasing the GIL, as the C call does) and raises
`NVMLError_Timeout`, so the wake-ups measured are the backend's own. What it cannot show:
the driver's own cost of each call, and anything about events actually arriving.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
NVML_NVLINK_MAX_LINKS = 36

_MESSAGES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLLibraryMismatchError(Exception):
    pass


class NVMLError(Exception):
    """`NVMLError(code)` becomes the subclass for `code`, as in pynvml."""

    _by_code: dict[int, type[NVMLError]] = {}  # noqa: RUF012
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: Any) -> NVMLError:
        return NVMLError.__new__(cls, code)

    klass = type(name, (NVMLError,), {"__new__": new})
    NVMLError._by_code[code] = klass
    return klass


NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_Timeout = _error_class("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_FunctionNotFound = _error_class(
    "NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND
)

_COUNT = 8
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)  # a DGX H100's GPU buses
_MEMORY_TOTAL = 81559 * 1024 * 1024
_MEMORY_USED = 4 * 1024 * 1024  # nvidia-smi's few MiB on an idle H100
_EVENTS_SUPPORTED = 0x1 | 0x2 | 0x8 | 0x100 | 0x4000 | 0x8000


class _Handle:
    """An opaque device handle; pynvml's is a ctypes pointer, the backend only passes it."""

    def __init__(self, index: int) -> None:
        self.index = index


_HANDLES = [_Handle(i) for i in range(_COUNT)]


def _device(handle: Any) -> int:
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.index


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return "550.54.15"


def nvmlSystemGetCudaDriverVersion() -> int:
    return 12040


def nvmlDeviceGetCount() -> int:
    return _COUNT


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= index < _COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _HANDLES[index]


def nvmlDeviceGetUUID(handle: Any) -> str:
    return f"GPU-5e0c1d2a-0000-4000-8000-0000000000{_device(handle):02x}"


def nvmlDeviceGetName(handle: Any) -> str:
    _device(handle)
    return "NVIDIA H100 80GB HBM3"


def nvmlDeviceGetMemoryInfo(handle: Any) -> SimpleNamespace:
    _device(handle)
    return SimpleNamespace(
        total=_MEMORY_TOTAL, free=_MEMORY_TOTAL - _MEMORY_USED, used=_MEMORY_USED
    )


def nvmlDeviceGetPciInfo(handle: Any) -> SimpleNamespace:
    bus = _BUSES[_device(handle)]
    return SimpleNamespace(
        busId=f"00000000:{bus:02X}:00.0", bus=bus, domain=0, device=0, pciDeviceId=0x233010DE
    )


def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
    _device(handle)
    return (9, 0)


def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    return _device(handle)


def nvmlDeviceGetNumaNodeId(handle: Any) -> int:
    return _device(handle) // 4


def nvmlDeviceGetMigMode(handle: Any) -> list[int]:
    _device(handle)
    return [0, 0]  # current, pending: MIG-capable, off


def nvmlDeviceGetMaxMigDeviceCount(handle: Any) -> int:
    _device(handle)
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle: Any, index: int) -> Any:
    _device(handle)
    raise NVMLError(NVML_ERROR_NOT_FOUND)  # MIG off: no MIG devices


def _mig_only(*args: Any) -> Any:
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # only reached with MIG devices


nvmlDeviceGetGpuInstanceId = _mig_only
nvmlDeviceGetComputeInstanceId = _mig_only
nvmlDeviceGetGpuInstanceById = _mig_only
nvmlGpuInstanceGetInfo = _mig_only


def nvmlDeviceGetGpuInstanceProfileInfo(handle: Any, profile: int) -> Any:
    _device(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetAttributes(handle: Any) -> Any:
    _device(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # whole GPU: the backend counts cores instead


def nvmlDeviceGetNumGpuCores(handle: Any) -> int:
    _device(handle)
    return 16896  # 132 SMs x 128


def nvmlDeviceGetNvLinkState(handle: Any, link: int) -> int:
    _device(handle)
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 1 if link < 18 else 0


def nvmlDeviceGetNvLinkRemotePciInfo(handle: Any, link: int) -> SimpleNamespace:
    _device(handle)
    return SimpleNamespace(busId=f"00000000:{0xC1 + link % 4:02X}:00.0")  # an NVSwitch


def nvmlDeviceGetP2PStatus(handle_a: Any, handle_b: Any, index: int) -> int:
    _device(handle_a), _device(handle_b)
    return 0  # NVML_P2P_STATUS_OK


def nvmlDeviceGetTopologyCommonAncestor(handle_a: Any, handle_b: Any) -> int:
    same_cpu = _device(handle_a) // 4 == _device(handle_b) // 4
    return 40 if same_cpu else 50  # NVML_TOPOLOGY_NODE / _SYSTEM


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[Any]:
    _device(handle)
    return []


def nvmlDeviceGetMPSComputeRunningProcesses(handle: Any) -> list[Any]:
    _device(handle)
    return []


def nvmlDeviceGetProcessUtilization(handle: Any, last_seen: int) -> list[Any]:
    _device(handle)
    raise NVMLError(NVML_ERROR_NOT_FOUND)  # no samples on an idle GPU


def nvmlDeviceGetUtilizationRates(handle: Any) -> SimpleNamespace:
    _device(handle)
    return SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    _device(handle)
    return 31


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    _device(handle)
    return 69_000  # milliwatts


# -- per-cgroup memory limits (r615+), with the field names of pynvml's structs --------
# The stand-in's driver is 550.54.15, which has no such call: like pynvml over that
# driver, both functions raise FUNCTION_NOT_FOUND. `GPUSLICE_STAND_IN_LIMITS=1` models an
# r615 driver instead (the limits kept per handle and cgroup path, usage 0).

_LIMITS: dict[tuple[int, str], tuple[int, int]] = {}


class c_nvmlSetMemoryLimits_v1_t:
    nameSpace: bytes | str = b""
    softLimit: int = 0
    hardLimit: int = 0


class c_nvmlGetMemoryLimits_v1_t(c_nvmlSetMemoryLimits_v1_t):
    currentUsed: int = 0


def _limits_call() -> None:
    import os

    if os.environ.get("GPUSLICE_STAND_IN_LIMITS") != "1":
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)


def _namespace(limits: Any) -> str:
    ns = limits.nameSpace
    return ns.decode() if isinstance(ns, bytes) else str(ns)


def nvmlDeviceSetMemoryLimits_v1(handle: Any, limits: Any) -> None:
    _limits_call()
    key = (_device(handle), _namespace(limits))
    if limits.softLimit == 0 and limits.hardLimit == NVML_DEVICE_MEMORY_LIMIT_MAX:
        _LIMITS.pop(key, None)
    else:
        _LIMITS[key] = (int(limits.softLimit), int(limits.hardLimit))


def nvmlDeviceGetMemoryLimits_v1(handle: Any, limits: Any) -> None:
    _limits_call()
    key = (_device(handle), _namespace(limits))
    limits.softLimit, limits.hardLimit = _LIMITS.get(key, (0, NVML_DEVICE_MEMORY_LIMIT_MAX))
    limits.currentUsed = 0


def nvmlDeviceGetHandleByUUID(uuid: str) -> _Handle:
    for handle in _HANDLES:
        if nvmlDeviceGetUUID(handle) == uuid:
            return handle
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _device(handle)
    return _EVENTS_SUPPORTED


class _EventSet:
    freed = False


def nvmlEventSetCreate() -> _EventSet:
    return _EventSet()


def nvmlDeviceRegisterEvents(handle: Any, event_types: int, event_set: _EventSet) -> None:
    _device(handle)


def nvmlEventSetWait_v2(event_set: _EventSet, timeout_ms: int) -> Any:
    """No event ever arrives: sleep the whole timeout (the GIL released, as in the C call),
    then fail as NVML does on a timeout."""
    if event_set.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    time.sleep(max(0, timeout_ms) / 1000)
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetFree(event_set: _EventSet) -> None:
    event_set.freed = True
