"""Creating and destroying single MIG devices: the simulator with the driver's rules, and
the NVML calls against a stand-in `pynvml` that keeps NVML's bookkeeping."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from gpuslice.backends import nvml_mig, open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.backends.simulated.control import ControlDir
from gpuslice.core.gpumodels import H100_80GB_MIG, H200_MIG
from gpuslice.core.jsontypes import Json
from gpuslice.ports import BackendError, MigGone, MigNotOurs


def sim(spec: str) -> SimulatedBackend:
    backend = open_backend(spec)
    assert isinstance(backend, SimulatedBackend)
    return backend


def test_created_devices_appear_in_the_inventory_and_go_again() -> None:
    backend = sim("sim:1xh100-80gb/mig=")
    gpu = backend.inventory().gpus[0]
    a = backend.create_mig(gpu.uuid, "4g.40gb", 0)
    b = backend.create_mig(gpu.uuid, "3g.40gb", 4)
    assert (a.placement_start, a.placement_size, b.placement_start) == (0, 4, 4)
    assert a.cap_minors is not None
    assert a.gi_id != b.gi_id
    live = backend.inventory().gpus[0].mig_devices
    assert (
        {m.uuid for m in live}
        == {a.uuid, b.uuid}
        == {m.uuid for m in backend.live_mig_devices(gpu.uuid)}
    )
    backend.destroy_mig(gpu.uuid, a.uuid, a.gi_id, a.ci_id)
    assert backend.inventory().gpus[0].mig_devices == (b,)
    again = backend.create_mig(gpu.uuid, "4g.40gb", 0)
    assert again.uuid != a.uuid  # NVML gives a re-created instance a new UUID
    backend.destroy_mig(gpu.uuid, again.uuid, again.gi_id, again.ci_id)
    with pytest.raises(MigGone):
        backend.destroy_mig(gpu.uuid, again.uuid, again.gi_id, again.ci_id)
    assert [c[0] for c in backend.mig_calls] == ["create", "create", "destroy", "create", "destroy"]


@pytest.mark.parametrize(
    ("layout", "profile", "start", "why"),
    [
        ("", "1g.10gb", 7, "cannot start at memory slice 7"),
        ("", "5g.50gb", 0, "has no MIG profile"),
        ("3g.40gb*2", "4g.40gb", 0, "overlaps 3g.40gb"),
        ("4g.40gb*1", "3g.40gb", 4, None),
        ("4g.40gb*1+2g.20gb*1", "1g.10gb", 6, None),
        ("2g.20gb*3", "1g.10gb+me", 6, None),
        ("1g.10gb+me*1", "1g.10gb+me", 3, "at most 1 1g.10gb+me"),
        ("1g.10gb*7", "1g.20gb", 6, "overlaps 1g.10gb"),
    ],
)
def test_the_driver_rules_hold(layout: str, profile: str, start: int, why: str | None) -> None:
    backend = sim(f"sim:1xh100-80gb/mig={layout}")
    gpu = backend.inventory().gpus[0]
    before = gpu.mig_devices
    if why is None:
        backend.create_mig(gpu.uuid, profile, start)
        return
    with pytest.raises(BackendError, match=why.replace("+", r"\+")):
        backend.create_mig(gpu.uuid, profile, start)
    assert backend.inventory().gpus[0].mig_devices == before  # a refusal changes nothing


def test_mig_mode_off_is_refused_never_toggled() -> None:
    backend = sim("sim:1xh100-80gb")
    gpu = backend.inventory().gpus[0]
    with pytest.raises(BackendError, match="not in MIG mode"):
        backend.create_mig(gpu.uuid, "1g.10gb", 0)
    assert not backend.inventory().gpus[0].mig_enabled


def test_an_instance_with_another_uuid_is_not_destroyed() -> None:
    backend = sim("sim:1xh100-80gb/mig=")
    gpu = backend.inventory().gpus[0]
    ours = backend.create_mig(gpu.uuid, "1g.10gb", 0)
    backend.destroy_mig(gpu.uuid, ours.uuid, ours.gi_id, ours.ci_id)
    theirs = backend.create_mig(gpu.uuid, "1g.10gb", 0)  # same GI/CI ids, someone else's
    assert (theirs.gi_id, theirs.ci_id) == (ours.gi_id, ours.ci_id)
    with pytest.raises(MigNotOurs):
        backend.destroy_mig(gpu.uuid, ours.uuid, ours.gi_id, ours.ci_id)
    assert backend.inventory().gpus[0].mig_devices == (theirs,)


def test_an_operator_creates_and_destroys_through_the_control_directory(tmp_path: Path) -> None:
    backend = open_backend("sim:1xh100-80gb/mig=", control_dir=tmp_path)
    control = ControlDir(tmp_path)
    control.send({"kind": "create_mig", "gpu": 0, "profile": "2g.20gb", "start": 2})
    [mig] = backend.inventory().gpus[0].mig_devices
    assert (mig.profile, mig.placement_start) == ("2g.20gb", 2)
    control.send({"kind": "create_mig", "gpu": 0, "profile": "2g.20gb", "start": 3})
    control.send({"kind": "destroy_mig", "gpu": 0, "mig": mig.uuid})
    assert backend.inventory().gpus[0].mig_devices == ()
    [rejected] = (tmp_path / "events").glob("*.rejected")  # refused by the driver's rules
    assert '"start": 3' in rejected.read_text()
    backend.close()


class FakeNvml:
    """What `nvml_mig` calls of pynvml, with NVML's bookkeeping of GPU and compute
    instances on one H100 (profiles and placements from the simulator's table)."""

    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

    class NVMLError(Exception):
        pass

    class NVMLError_NotFound(NVMLError):
        pass

    class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
        _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]

    _ENUM: ClassVar[dict[int, str]] = {
        0x0: "1g.10gb", 0x7: "1g.10gb+me", 0x9: "1g.20gb", 0x1: "2g.20gb",
        0x2: "3g.40gb", 0x3: "4g.40gb", 0x4: "7g.80gb",
    }  # fmt: skip
    _IDS: ClassVar[dict[str, int]] = {
        "1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14,
        "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0,
    }  # fmt: skip

    def __init__(self, fail_ci: bool = False) -> None:
        self.gis: dict[int, Json] = {}
        self.fail_ci = fail_ci
        self.calls: list[str] = []

    def _profile(self, pid: int) -> Any:
        name = next(n for n, i in self._IDS.items() if i == pid)
        found = H100_80GB_MIG.profile(name)
        assert found is not None
        return found

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, enum: int) -> Any:
        if enum not in self._ENUM:
            raise self.NVMLError("Not Supported")
        p = H100_80GB_MIG.profile(self._ENUM[enum])
        assert p is not None
        return SimpleNamespace(
            id=self._IDS[p.name], sliceCount=p.compute_slices, instanceCount=p.max_instances,
            multiprocessorCount=p.multiprocessors, copyEngineCount=p.copy_engines,
            decoderCount=p.decoders, encoderCount=p.encoders, jpegCount=p.jpeg,
            ofaCount=p.ofa, memorySizeMB=p.memory_mib,
        )  # fmt: skip

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, pid: int, array: Any, count: Any
    ) -> None:
        p = self._profile(pid)
        n = ctypes.cast(count, ctypes.POINTER(ctypes.c_uint))
        for i, start in enumerate(p.starts):
            array[i].start, array[i].size = start, p.memory_slices
        n.contents.value = len(p.starts)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, pid: int, placement: Any
    ) -> Any:
        gi = min(set(range(1, 16)) - set(self.gis))
        self.gis[gi] = {"profile": pid, "start": placement.start, "cis": {}}
        self.calls.append(f"create-gi {gi}")
        return gi

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        return SimpleNamespace(id=gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, enum: int, eng: int) -> Any:
        return SimpleNamespace(id=enum)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_profile: int) -> Any:
        if self.fail_ci:
            raise self.NVMLError("Insufficient Resources")
        self.gis[gi]["cis"][0] = ci_profile
        self.calls.append(f"create-ci {gi}/0")
        return (gi, 0)

    def nvmlComputeInstanceGetInfo(self, ci: Any) -> Any:
        return SimpleNamespace(id=ci[1])

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi: int) -> Any:
        if gi not in self.gis:
            raise self.NVMLError_NotFound("Not Found")
        return gi

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: int, ci: int) -> Any:
        if ci not in self.gis[gi]["cis"]:
            raise self.NVMLError_NotFound("Not Found")
        return (gi, ci)

    def nvmlComputeInstanceDestroy(self, ci: Any) -> None:
        del self.gis[ci[0]]["cis"][ci[1]]
        self.calls.append(f"destroy-ci {ci[0]}/{ci[1]}")

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        if self.gis[gi]["cis"]:
            raise self.NVMLError("In Use")
        del self.gis[gi]
        self.calls.append(f"destroy-gi {gi}")


def test_nvml_geometry_matches_the_simulators_table() -> None:
    geometry = nvml_mig.read_geometry(FakeNvml(), None, 81559)
    assert geometry is not None
    assert (geometry.memory_slices, geometry.compute_slices) == (8, 7)
    by_name = {p.name: p for p in geometry.profiles}
    for table in H100_80GB_MIG.profiles:
        got = by_name[table.name]
        assert (got.starts, got.memory_slices, got.multiprocessors, got.ofa) == (
            table.starts, table.memory_slices, table.multiprocessors, table.ofa
        )  # fmt: skip
        assert got.profile_id == FakeNvml._IDS[table.name]


def test_nvml_create_then_destroy_and_a_failed_compute_instance_is_rolled_back() -> None:
    nv = FakeNvml()
    geometry = nvml_mig.read_geometry(nv, None, 81559)
    assert geometry is not None
    profile = geometry.profile("3g.40gb")
    assert profile is not None
    gi, ci = nvml_mig.create(nv, None, profile, 4)
    assert nv.gis[gi]["start"] == 4
    assert ci == 0
    nvml_mig.destroy(nv, None, gi, ci)
    assert nv.gis == {}
    assert nv.calls[-2:] == [f"destroy-ci {gi}/0", f"destroy-gi {gi}"]
    with pytest.raises(MigGone):
        nvml_mig.destroy(nv, None, gi, ci)

    failing = FakeNvml(fail_ci=True)
    with pytest.raises(BackendError, match="Insufficient Resources"):
        nvml_mig.create(failing, None, profile, 0)
    assert failing.gis == {}
    assert failing.calls == ["create-gi 1", "destroy-gi 1"]


H200_RECORDED = {
    # enum: (id, slices, count, SMs, MiB, copy, decoders, encoders, jpeg, ofa, starts, size)
    0x0: (19, 1, 7, 16, 16384, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    0x1: (14, 2, 3, 32, 33280, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    0x2: (9, 3, 2, 60, 71424, 3, 3, 0, 3, 0, (0, 4), 4),
    0x3: (5, 4, 1, 64, 71424, 4, 4, 0, 4, 0, (0,), 4),
    0x4: (0, 7, 1, 132, 143360, 8, 7, 0, 7, 1, (0,), 8),
    0x7: (20, 1, 1, 16, 16384, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    0x9: (15, 1, 4, 26, 33280, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
}
"""NVML's answers on an H200 (MIG mode off), read with `nvmlDeviceGetGpuInstanceProfileInfoV`
and `nvmlDeviceGetGpuInstancePossiblePlacements_v2`; every other enum index answered
NOT_SUPPORTED."""


class RecordedNvml(FakeNvml):
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, enum: int) -> Any:
        if enum not in H200_RECORDED:
            raise self.NVMLError("Not Supported")
        pid, sl, cnt, sms, mib, ce, dec, enc, jpg, ofa, _, _ = H200_RECORDED[enum]
        return SimpleNamespace(
            id=pid, sliceCount=sl, instanceCount=cnt, multiprocessorCount=sms,
            copyEngineCount=ce, decoderCount=dec, encoderCount=enc, jpegCount=jpg,
            ofaCount=ofa, memorySizeMB=mib,
        )  # fmt: skip

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, pid: int, array: Any, count: Any
    ) -> None:
        row = next(r for r in H200_RECORDED.values() if r[0] == pid)
        starts, size = row[10], row[11]
        for i, start in enumerate(starts):
            array[i].start, array[i].size = start, size
        ctypes.cast(count, ctypes.POINTER(ctypes.c_uint)).contents.value = len(starts)


def test_the_h200_table_is_what_nvml_answers_on_an_h200() -> None:
    """The simulator's H200 profiles (and so the counters dynamic MIG publishes for it) are
    the hardware's: the NVML backend's reading of the recorded answers gives the table."""
    geometry = nvml_mig.read_geometry(RecordedNvml(), None, 143771)
    assert geometry is not None
    table = {p.name: p for p in H200_MIG.profiles}
    assert {p.name for p in geometry.profiles} == set(table)
    for got in geometry.profiles:
        want = table[got.name]
        assert got == replace(want, profile_id=got.profile_id), got.name
