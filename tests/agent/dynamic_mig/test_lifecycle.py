"""A dynamic MIG device through Prepare, Unprepare, crashes and restarts: nothing leaks,
nothing someone else made is destroyed, and the claim can be retried.

A crash is the agent dying between two steps: the step raises `Crash`, the `DynamicMig`
object is dropped, and a new one starts from what is on disk and on the (simulated) GPU,
as a restarted agent does. The GPU keeps its instances across the crash, as a real one
does across an agent restart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuslice.agent.dynamic_mig import JOURNAL_NAME, DynamicMig
from gpuslice.backends import open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.core.devices import MigDevice
from gpuslice.core.dra.claims import ClaimError
from gpuslice.core.dra.migrecord import FORMAT, VERSION, decode
from gpuslice.core.dra.partitions import Partition, partitions
from gpuslice.core.dra.prepared import sealed
from gpuslice.host.checkpoint_file import CheckpointFile

UID = "11111111-2222-3333-4444-555555555555"
BOOT = "boot-1"


class Crash(Exception):
    """The agent died here."""


class CrashingFile(CheckpointFile):
    """The record's file; the write numbered `crash_at` (1-based) kills the agent first."""

    def __init__(self, path: Path, crash_at: int | None = None) -> None:
        super().__init__(path)
        self.crash_at = crash_at
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes == self.crash_at:
            raise Crash(f"write {self.writes}")
        super().write(data)


class CrashingCreate:
    """The backend, with the agent dying inside `create_mig` before the driver acted."""

    def __init__(self, backend: SimulatedBackend) -> None:
        self.backend = backend

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigDevice:
        raise Crash("in create_mig")

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str, gi_id: int, ci_id: int) -> None:
        self.backend.destroy_mig(gpu_uuid, mig_uuid, gi_id, ci_id)

    def live_mig_devices(self, gpu_uuid: str) -> tuple[MigDevice, ...]:
        return self.backend.live_mig_devices(gpu_uuid)


@pytest.fixture
def backend() -> SimulatedBackend:
    b = open_backend("sim:1xh100-80gb/mig=")
    assert isinstance(b, SimulatedBackend)
    return b


def part(backend: SimulatedBackend, name: str = "gpu-0-mig-1g10gb-19-3") -> Partition:
    gpu = backend.inventory().gpus[0]
    assert gpu.mig_geometry is not None
    return {p.name: p for p in partitions(gpu, gpu.mig_geometry)}[name]


def gpu_uuid(backend: SimulatedBackend) -> str:
    return backend.inventory().gpus[0].uuid


def migs(backend: SimulatedBackend) -> tuple[MigDevice, ...]:
    return backend.live_mig_devices(gpu_uuid(backend))


def on_disk(tmp_path: Path) -> list[tuple[str, bool]]:
    raw = (tmp_path / JOURNAL_NAME).read_bytes()
    decoded = decode(raw, BOOT)
    assert decoded.status == "ok"
    return [(r.device, r.created is not None) for r in decoded.journal.records]


def manager(backend: object, tmp_path: Path, crash_at: int | None = None) -> DynamicMig:
    return DynamicMig(backend, CrashingFile(tmp_path / JOURNAL_NAME, crash_at), BOOT)  # type: ignore[arg-type]


async def test_prepare_creates_records_and_unprepare_destroys(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    dyn = manager(backend, tmp_path)
    await dyn.load(set())
    p = part(backend)
    mig = await dyn.materialize(UID, p)
    assert (mig.profile, mig.placement_start) == ("1g.10gb", 3)
    assert mig.cap_minors is not None  # the CDI spec's nvidia-caps nodes
    assert migs(backend) == (mig,)
    assert on_disk(tmp_path) == [(p.name, True)]
    assert dyn.ours() == {mig.uuid}
    # the kubelet asks again after its restart: the same device, nothing created
    assert await dyn.materialize(UID, p) == mig
    assert [c[0] for c in backend.mig_calls] == ["create"]
    assert await dyn.release(UID) == ""
    assert migs(backend) == ()
    assert on_disk(tmp_path) == []
    assert await dyn.release(UID) == ""  # an Unprepare repeated: nothing left to do


async def test_recorded_but_not_created(backend: SimulatedBackend, tmp_path: Path) -> None:
    dying = manager(CrashingCreate(backend), tmp_path)
    await dying.load(set())
    with pytest.raises(Crash):
        await dying.materialize(UID, part(backend))
    assert on_disk(tmp_path) == [("gpu-0-mig-1g10gb-19-3", False)]

    restarted = manager(backend, tmp_path)
    await restarted.load(set())
    assert on_disk(tmp_path) == []
    assert backend.mig_calls == []  # nothing was destroyed: there was nothing
    assert (await restarted.materialize(UID, part(backend))).placement_start == 3  # retried


@pytest.mark.parametrize("prepared", [set(), None], ids=["not-prepared", "record-unknown"])
async def test_created_but_not_recorded(
    backend: SimulatedBackend, tmp_path: Path, prepared: set[str] | None
) -> None:
    """The crash falls between creation and its record (the second write): the instance
    at the recorded placement is ours. Its claim not prepared, it is destroyed; with the
    DRA record unknown, it is kept (never destroyed on a guess)."""
    dying = manager(backend, tmp_path, crash_at=3)  # 1: load, 2: creating, 3: created
    await dying.load(set())
    with pytest.raises(Crash):
        await dying.materialize(UID, part(backend))
    [made] = migs(backend)
    assert on_disk(tmp_path) == [("gpu-0-mig-1g10gb-19-3", False)]

    restarted = manager(backend, tmp_path)
    await restarted.load(prepared)
    if prepared is None:
        assert migs(backend) == (made,)
        assert restarted.ours() == {made.uuid}
        assert on_disk(tmp_path) == [("gpu-0-mig-1g10gb-19-3", True)]
        return
    assert migs(backend) == ()
    assert on_disk(tmp_path) == []
    again = await restarted.materialize(UID, part(backend))  # the retry gets a new one
    assert again.uuid != made.uuid


async def test_created_and_prepared_survives_a_restart(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    first = manager(backend, tmp_path)
    await first.load(set())
    mig = await first.materialize(UID, part(backend))

    restarted = manager(backend, tmp_path)
    await restarted.load({UID})
    assert migs(backend) == (mig,)
    assert await restarted.materialize(UID, part(backend)) == mig  # the kubelet's re-Prepare
    assert await restarted.release(UID) == ""
    assert migs(backend) == ()


async def test_created_for_a_prepare_cut_short_is_destroyed_at_start(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    first = manager(backend, tmp_path)
    await first.load(set())
    await first.materialize(UID, part(backend))
    # the agent died before the DRA record said PrepareCompleted
    restarted = manager(backend, tmp_path)
    await restarted.load(set())
    assert migs(backend) == ()
    assert on_disk(tmp_path) == []


async def test_someone_elses_instance_is_refused_and_left(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    theirs = backend.create_mig(gpu_uuid(backend), "2g.20gb", 2)  # slices 2, 3
    dyn = manager(backend, tmp_path)
    await dyn.load(set())
    taken = f"taken by MIG device 2g.20gb at placement 2:2 (GPU instance {theirs.gi_id}, "
    with pytest.raises(ClaimError, match=re.escape(f"{taken}{theirs.uuid})")):
        await dyn.materialize(UID, part(backend))
    assert migs(backend) == (theirs,)
    assert on_disk(tmp_path) == []
    assert theirs.uuid not in dyn.ours()


async def test_an_instance_replaced_by_someone_else_is_not_destroyed(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    dyn = manager(backend, tmp_path)
    await dyn.load(set())
    ours = await dyn.materialize(UID, part(backend))
    gpu = gpu_uuid(backend)
    backend.destroy_mig(gpu, ours.uuid, ours.gi_id, ours.ci_id)  # an operator's doing
    theirs = backend.create_mig(gpu, "1g.10gb", 3)  # the same GI/CI ids, another UUID
    assert (theirs.gi_id, theirs.ci_id) == (ours.gi_id, ours.ci_id)
    assert await dyn.release(UID) == ""
    assert migs(backend) == (theirs,)
    assert on_disk(tmp_path) == []


async def test_a_corrupt_record_is_rebuilt_from_the_prepared_claims(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    first = manager(backend, tmp_path)
    await first.load(set())
    ours = await first.materialize(UID, part(backend))
    theirs = backend.create_mig(gpu_uuid(backend), "3g.40gb", 4)
    (tmp_path / JOURNAL_NAME).write_bytes(b'{"format": "gpuslice.io/dynamic-mig", "vers')

    restarted = manager(backend, tmp_path)
    uses = [(UID, "gpu-0-mig-1g10gb-19-3", ours.uuid)]
    await restarted.load({UID}, uses, gpus=[gpu_uuid(backend)])
    assert len(list(tmp_path.glob(f"{JOURNAL_NAME}.corrupt-*"))) == 1  # noqa: ASYNC240
    assert restarted.ours() == {ours.uuid}
    assert await restarted.release(UID) == ""
    assert migs(backend) == (theirs,)  # never ours: never destroyed


async def test_a_record_from_before_a_reboot_destroys_nothing(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    first = manager(backend, tmp_path)
    await first.load(set())
    mig = await first.materialize(UID, part(backend))
    after_reboot = DynamicMig(backend, CheckpointFile(tmp_path / JOURNAL_NAME), "boot-2")
    await after_reboot.load(set())
    assert migs(backend) == (mig,)  # (a real reboot would have removed it; whatever is
    assert after_reboot.ours() == frozenset()  # there now is not gpuslice's)


async def test_a_refused_creation_leaves_no_record(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    plain = open_backend("sim:1xh100-80gb/mig=")
    assert isinstance(plain, SimulatedBackend)
    plain.set_mig(gpu_uuid(plain), False, None)  # MIG mode turned off meanwhile
    dyn = manager(plain, tmp_path)
    await dyn.load(set())
    with pytest.raises(ClaimError, match="not in MIG mode"):
        await dyn.materialize(UID, part(backend))
    assert on_disk(tmp_path) == []
    assert not plain.inventory().gpus[0].mig_enabled


@pytest.mark.parametrize("data", [{}, {"records": None}, {"records": []}], ids=str)
def test_a_record_without_records_holds_none(data: dict[str, object]) -> None:
    decoded = decode(sealed(data, FORMAT, VERSION), BOOT)
    assert (decoded.status, decoded.journal.records) == ("ok", ())


@pytest.mark.parametrize("records", [{"a": 1}, "abc", 5], ids=str)
def test_records_that_are_no_list_are_a_corrupt_file(records: object) -> None:
    decoded = decode(sealed({"records": records}, FORMAT, VERSION), BOOT)
    assert decoded.status == "corrupt"
    assert decoded.reason == "TypeError: records is not a list"
