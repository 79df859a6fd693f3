"""The NVML backend on a unified-memory GPU (GB10 / DGX Spark, Jetson Thor), against a
scripted pynvml module: there `nvmlDeviceGetMemoryInfo` answers NOT_SUPPORTED, which NVIDIA's
device plugin, GFD and DRA driver tolerate. The node must still list its GPU (memory 0, so
the rest of gpuslice shares it by count), report its statuses without memory figures, and
tell a lost GPU from one that merely has no memory query.

The scripted module answers what the backend asks of a GB10 (name, PCI, compute
capability, UUID); every other `nvml*` query answers NOT_SUPPORTED, as optional queries do on
real parts. The real driver's answers are the contract suite's (`--with-gpu`).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuslice.backends.nvml import EVENT_XID, NvmlBackend
from gpuslice.core.health import HealthEvent
from gpuslice.core.jsontypes import Json

UUIDS = ("GPU-bbbbbbbb-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002")
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
UNKNOWN = 999


class Gb10Nvml:
    """GPU 0 is a GB10 (no memory query); GPU 1 a discrete GPU with 16 GiB (a mixed node is
    not a real product, but it shows the two kinds side by side)."""

    def __init__(self) -> None:
        self.lost: set[int] = set()
        self.wait_fails = threading.Event()
        self.ended = False

    def module(self) -> types.ModuleType:
        nv = types.ModuleType("pynvml")
        scripted = self

        class NVMLError(Exception):
            def __init__(self, value: int) -> None:
                super().__init__(value)
                self.value = value

        class NVMLError_NotSupported(NVMLError):
            pass

        class NVMLError_GpuIsLost(NVMLError):
            pass

        class NVMLError_Timeout(NVMLError):
            pass

        class NVMLError_Unknown(NVMLError):
            pass

        def device(fn: Callable[[int], Any]) -> Callable[[tuple[str, int]], Any]:
            def call(handle: tuple[str, int], *_: Any) -> Any:
                if handle[1] in scripted.lost:
                    raise NVMLError_GpuIsLost(GPU_IS_LOST)
                return fn(handle[1])

            return call

        gib16 = 16 * 1024**3
        t4_memory = device(
            lambda i: types.SimpleNamespace(total=gib16, used=1024**3, free=gib16 - 1024**3)
        )

        def memory(handle: tuple[str, int]) -> Any:
            # The driver refuses the query for what the GPU is, lost or not.
            if handle[1] == 0:
                raise NVMLError_NotSupported(NOT_SUPPORTED)
            return t4_memory(handle)

        def wait(event_set: object, timeout_ms: int) -> Any:
            # Blocks as the driver's wait does (until the test fails it or ends), so the
            # watcher thread does not spin on timeouts.
            if scripted.wait_fails.wait(min(timeout_ms / 1000, 1.0)) and not scripted.ended:
                scripted.wait_fails.clear()
                raise NVMLError_Unknown(UNKNOWN)
            raise NVMLError_Timeout(10)

        def not_supported(*_: Any) -> Any:
            raise NVMLError_NotSupported(NOT_SUPPORTED)

        def module_getattr(name: str) -> Any:
            if name.startswith("nvml"):
                return not_supported
            raise AttributeError(name)

        pci = {
            0: types.SimpleNamespace(busId="0000000F:01:00.0", pciDeviceId=0x2E1210DE),
            1: types.SimpleNamespace(busId="00000000:07:00.0", pciDeviceId=0x1EB810DE),
        }
        names = {0: "NVIDIA GB10", 1: "Tesla T4"}
        capabilities = {0: (12, 1), 1: (7, 5)}
        values: Json = {
            "NVMLError": NVMLError,
            "NVMLError_NotSupported": NVMLError_NotSupported,
            "NVMLError_GpuIsLost": NVMLError_GpuIsLost,
            "NVMLError_Timeout": NVMLError_Timeout,
            "NVMLError_NotFound": NVMLError_NotSupported,
            "NVMLError_InvalidArgument": NVMLError_NotSupported,
            "NVMLLibraryMismatchError": type("NVMLLibraryMismatchError", (Exception,), {}),
            "NVML_NVLINK_MAX_LINKS": 0,
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "580.95.05",
            "nvmlSystemGetCudaDriverVersion": lambda: 13000,
            "nvmlDeviceGetCount": lambda: len(UUIDS),
            "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
            "nvmlDeviceGetUUID": device(lambda i: UUIDS[i]),
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetName": device(lambda i: names[i]),
            "nvmlDeviceGetPciInfo": device(lambda i: pci[i]),
            "nvmlDeviceGetCudaComputeCapability": device(lambda i: capabilities[i]),
            "nvmlDeviceGetMinorNumber": device(lambda i: i),
            "nvmlDeviceGetNumGpuCores": device(lambda i: 6144 if i == 0 else 2560),
            "nvmlDeviceGetSupportedEventTypes": lambda h: EVENT_XID,
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlDeviceRegisterEvents": lambda h, mask, es: None,
            "nvmlEventSetWait_v2": wait,
            "nvmlEventSetFree": lambda es: None,
            "__getattr__": module_getattr,
        }
        for key, value in values.items():
            setattr(nv, key, value)
        return nv


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gb10Nvml]:
    scripted = Gb10Nvml()
    monkeypatch.setitem(sys.modules, "pynvml", scripted.module())
    yield scripted
    scripted.ended = True
    scripted.wait_fails.set()  # a watcher still waiting leaves at once


def test_a_gpu_without_memory_info_is_listed_with_memory_0(nvml: Gb10Nvml) -> None:
    backend = NvmlBackend()
    try:
        inv = backend.inventory()
    finally:
        backend.close()
    gb10, t4 = inv.gpus
    assert (gb10.product_name, gb10.uuid, gb10.memory_mib) == ("NVIDIA GB10", UUIDS[0], 0)
    assert not gb10.memory_reported
    assert gb10.multiprocessors == 48  # 6144 cores, 128 per SM on sm_12x
    assert gb10.compute_capability == (12, 1)
    assert (t4.memory_mib, t4.memory_reported) == (16384, True)


def test_statuses_of_a_gpu_without_memory_info_carry_no_memory_figures(nvml: Gb10Nvml) -> None:
    backend = NvmlBackend()
    try:
        by_uuid = {s.gpu_uuid: s for s in backend.statuses()}
    finally:
        backend.close()
    assert set(by_uuid) == set(UUIDS), "the GB10 is not dropped from the statuses"
    assert (by_uuid[UUIDS[0]].memory_used_mib, by_uuid[UUIDS[0]].memory_free_mib) == (None, None)
    assert (by_uuid[UUIDS[1]].memory_used_mib, by_uuid[UUIDS[1]].memory_free_mib) == (1024, 15360)


def test_a_failed_wait_marks_lost_only_the_gpu_that_is_lost(nvml: Gb10Nvml) -> None:
    """The lost-GPU probe asked the memory query, which a GB10 never answers: the probe
    then found no lost GPU and marked every GPU lost. It asks the GB10 its UUID instead."""
    backend = NvmlBackend()
    try:
        backend.inventory()
        nvml.lost.add(0)
        nvml.wait_fails.set()
        assert backend.wait_health_event(15) == HealthEvent("lost", UUIDS[0])
        assert backend.wait_health_event(0) is None, "the T4 answers: it is not lost"
    finally:
        backend.close()
