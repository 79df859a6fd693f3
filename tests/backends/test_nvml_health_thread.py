"""The NVML backend's health watcher thread, against a scripted pynvml module.

No driver is needed: the module below answers the few calls the backend makes to list GPUs
and register events, and its `nvmlEventSetWait_v2` blocks until the test hands it an event
(or lets it time out). What is checked is the threading the real driver cannot show on
demand: an XID reaches `wait_health_event`, `close()` returns while a wait is still in the
driver, and the event set is freed and NVML shut down only after that wait has left, once.
The NVML calls themselves run against a real driver in the contract suite (`--with-gpu`).
"""

from __future__ import annotations

import queue
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

from gpuslice.backends.nvml import EVENT_XID, NvmlBackend
from gpuslice.core.health import NO_INSTANCE, HealthEvent
from gpuslice.testing.logcapture import captured_events

UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-aaaaaaaa-0000-0000-0000-000000000002")
TIMEOUT = 10  # pynvml's NVML_ERROR_TIMEOUT


class ScriptedNvml:
    """Records calls; each wait takes the next item the test puts on `waits`."""

    def __init__(self) -> None:
        self.waits: queue.Queue[object] = queue.Queue()
        self.in_wait = threading.Event()
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.waiting = 0
        self.freed_during_wait = False
        self.shut_down = threading.Event()

    def module(self) -> types.ModuleType:
        nv = types.ModuleType("pynvml")

        class NVMLError(Exception):
            def __init__(self, value: int) -> None:
                super().__init__(value)
                self.value = value

        class NVMLError_Timeout(NVMLError):
            pass

        class NVMLError_GpuIsLost(NVMLError):
            pass

        def record(name: str) -> None:
            with self.lock:
                self.calls.append(name)
                if name in ("nvmlEventSetFree", "nvmlShutdown") and self.waiting:
                    self.freed_during_wait = True
            if name == "nvmlShutdown":
                self.shut_down.set()

        def wait(event_set: object, timeout_ms: int) -> Any:
            with self.lock:
                self.waiting += 1
            self.in_wait.set()
            try:
                item = self.waits.get()
            finally:
                with self.lock:
                    self.waiting -= 1
                self.in_wait.clear()
            if item is None:
                raise NVMLError_Timeout(TIMEOUT)
            return item

        nv.NVMLError = NVMLError  # type: ignore[attr-defined]
        nv.NVMLError_Timeout = NVMLError_Timeout  # type: ignore[attr-defined]
        nv.NVMLError_GpuIsLost = NVMLError_GpuIsLost  # type: ignore[attr-defined]
        nv.nvmlInit = lambda: record("nvmlInit")  # type: ignore[attr-defined]
        nv.nvmlShutdown = lambda: record("nvmlShutdown")  # type: ignore[attr-defined]
        nv.nvmlDeviceGetCount = lambda: len(UUIDS)  # type: ignore[attr-defined]
        nv.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
        nv.nvmlDeviceGetUUID = lambda h: UUIDS[h[1]]  # type: ignore[attr-defined]
        nv.nvmlDeviceGetSupportedEventTypes = lambda h: EVENT_XID  # type: ignore[attr-defined]
        nv.nvmlEventSetCreate = lambda: "event-set"  # type: ignore[attr-defined]
        nv.nvmlDeviceRegisterEvents = lambda h, mask, es: None  # type: ignore[attr-defined]
        nv.nvmlEventSetWait_v2 = wait  # type: ignore[attr-defined]
        nv.nvmlEventSetFree = lambda es: record("nvmlEventSetFree")  # type: ignore[attr-defined]
        return nv


def xid(device: int, code: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        device=("handle", device),
        eventType=EVENT_XID,
        eventData=code,
        gpuInstanceId=NO_INSTANCE,
        computeInstanceId=NO_INSTANCE,
    )


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedNvml]:
    scripted = ScriptedNvml()
    monkeypatch.setitem(sys.modules, "pynvml", scripted.module())
    yield scripted
    for _ in range(4):  # let a watcher left in a wait leave (its thread is a daemon anyway)
        scripted.waits.put(None)


def test_an_xid_from_the_watcher_reaches_wait_health_event(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    try:
        assert nvml.in_wait.wait(5), "the watcher thread never waited on the event set"
        nvml.waits.put(xid(1, 79))
        assert backend.wait_health_event(5) == HealthEvent("xid", UUIDS[1], xid=79)
    finally:
        backend.close()


def test_close_returns_while_a_wait_is_in_the_driver_and_frees_after_it(
    nvml: ScriptedNvml,
) -> None:
    backend = NvmlBackend()
    assert nvml.in_wait.wait(5)
    got: list[HealthEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(backend.wait_health_event(60)))
    waiter.start()
    closer = threading.Thread(target=backend.close)
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "close() waited for the NVML wait to end"
    # A caller blocked on events is released by the close, not by its 60 s timeout.
    waiter.join(5)
    assert not waiter.is_alive()
    assert got == [None]
    assert "nvmlEventSetFree" not in nvml.calls
    assert "nvmlShutdown" not in nvml.calls

    nvml.waits.put(None)  # the driver's wait times out; the watcher sees the close and frees
    assert nvml.shut_down.wait(5), "the watcher never released NVML after its wait"
    assert nvml.calls.count("nvmlEventSetFree") == 1
    assert nvml.calls.count("nvmlShutdown") == 1
    assert not nvml.freed_during_wait
    backend.close()  # a second close changes nothing
    assert nvml.calls.count("nvmlShutdown") == 1


def _refusing(nv: types.ModuleType, refused: dict[int, type[Exception]]) -> None:
    """`nvmlDeviceRegisterEvents` raises the given NVML error for the given GPU indices."""

    def register(handle: tuple[str, int], mask: int, event_set: object) -> None:
        error = refused.get(handle[1])
        if error is not None:
            raise error(999)

    nv.nvmlDeviceRegisterEvents = register  # type: ignore[attr-defined]


def test_a_gpu_whose_events_cannot_be_registered_is_reported_unmonitored_by_uuid(
    nvml: ScriptedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVIDIA's device plugin marks such a GPU unhealthy and its DRA driver taints it
    `unmonitored`: the backend must say which GPU it could not watch, not pass it for a
    healthy one with an anonymous log line."""
    nv = nvml.module()
    _refusing(nv, {1: nv.NVMLError})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    with captured_events() as logs:
        backend = NvmlBackend()
    try:
        event = backend.wait_health_event(5)
        assert event is not None
        assert (event.kind, event.gpu_uuid) == ("unmonitored", UUIDS[1])
        assert "registering its events" in event.reason
        [failed] = [e for e in logs if e["event"] == "nvml-health-register-failed"]
        assert failed["gpu"] == UUIDS[1]
        # the other GPU is watched: its XIDs still arrive
        assert nvml.in_wait.wait(5)
        nvml.waits.put(xid(0, 79))
        assert backend.wait_health_event(5) == HealthEvent("xid", UUIDS[0], xid=79)
    finally:
        backend.close()


def test_a_gpu_nvml_calls_too_old_for_health_events_is_reported_unsupported(
    nvml: ScriptedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's NOT_SUPPORTED: NVIDIA's device plugin keeps the GPU in service (a warning),
    its DRA driver taints it `unmonitored`; the backend tells the two cases apart."""
    nv = nvml.module()

    class NVMLError_NotSupported(nv.NVMLError):  # type: ignore[name-defined,misc]
        pass

    nv.NVMLError_NotSupported = NVMLError_NotSupported  # type: ignore[attr-defined]
    _refusing(nv, {0: NVMLError_NotSupported})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    backend = NvmlBackend()
    try:
        event = backend.wait_health_event(5)
        assert event is not None
        assert (event.kind, event.gpu_uuid) == ("unsupported", UUIDS[0])
        assert backend.wait_health_event(0.2) is None  # GPU 1 is watched
    finally:
        backend.close()
