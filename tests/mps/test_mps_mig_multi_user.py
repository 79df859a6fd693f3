"""A DRA claim's MPS daemon on MIG devices, or multi-user, run by the manager against the
fake control program: it sees only its MIG devices (`CUDA_VISIBLE_DEVICES`), leaves the
GPU's compute mode alone, starts with `-M` when multi-user, and is taken over by the next
agent only when it was started that same way."""

from __future__ import annotations

import json
from pathlib import Path

from gpuslice.core.dra.claims import daemon_spec
from gpuslice.core.mps import MpsDaemonSpec
from gpuslice.emulator.fake_mps_control import main as fake_main
from gpuslice.mps.control import process_alive

from .conftest import wait_until
from .test_mps_manager import daemon_pid, fake_smi, manager_for, probe, read, running

GPU = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
MIGS = ("MIG-11111111-2222-3333-4444-555555555555", "MIG-66666666-7777-8888-9999-000000000000")


def mig_spec(root: Path, *, multi_user: bool = False) -> MpsDaemonSpec:
    return daemon_spec(
        "0b8e1d7c-3a52-4f0e-9c1d-2e4f6a8b0c1d-abcde",
        str(root),
        [(GPU, 0)],
        thread_percentage=25,
        limits_mib={1: 2048},
        mig_uuids=MIGS,
        multi_user=multi_user,
    )


def started_line(spec: MpsDaemonSpec) -> str:
    """The latest start's line: the fake logs what the daemon was started with."""
    log = read(Path(spec.log_dir) / "control.log")
    return [line for line in log.splitlines() if " Started" in line][-1]


async def test_a_mig_daemon_sees_its_mig_devices_and_leaves_compute_mode_alone(
    sock_dir: Path,
) -> None:
    calls = sock_dir / "smi.log"
    spec = mig_spec(sock_dir)
    manager = manager_for([spec], compute_mode=fake_smi(calls, "ok"))
    async with running(manager):
        await wait_until(manager, lambda: manager.ready(spec.resource), 10)
        assert started_line(spec).endswith(f"multi-user=no CUDA_VISIBLE_DEVICES={','.join(MIGS)}")
        control = probe(spec)
        assert await control.send("get_default_device_pinned_mem_limit 1") == "2G"
        sent = read(Path(spec.log_dir) / "control.log")
        assert "set_default_device_pinned_mem_limit 1 2048M" in sent
        assert await control.send("get_default_active_thread_percentage") == "25.0"
        recorded = json.loads(read(Path(spec.started_marker)))
        assert recorded["mig_uuids"] == list(MIGS)
        assert "multi_user" not in recorded
    # compute mode is the whole GPU's: a MIG daemon neither sets nor resets it
    assert not calls.exists()
    assert manager.problems == ()


async def test_a_multi_user_daemon_starts_with_dash_m_and_is_taken_over_only_as_such(
    sock_dir: Path,
) -> None:
    spec = mig_spec(sock_dir, multi_user=True)
    first = manager_for([spec], keep_running=True)
    async with running(first):
        await wait_until(first, lambda: first.ready(spec.resource), 10)
        assert " multi-user=yes " in started_line(spec)
        pid = daemon_pid(spec)
    assert pid is not None
    assert process_alive(pid)
    again = manager_for([spec], keep_running=True)
    async with running(again):
        await wait_until(again, lambda: again.ready(spec.resource), 10)
        assert daemon_pid(spec) == pid  # the same settings: taken over, clients kept
    # a single-user daemon for the same key is another daemon: the running one is replaced
    single = mig_spec(sock_dir)
    assert single.resource == spec.resource
    third = manager_for([single], keep_running=True)
    async with running(third):
        await wait_until(third, lambda: third.ready(single.resource), 10)
        await wait_until(third, lambda: daemon_pid(single) not in (None, pid), 10)
        assert " multi-user=no " in started_line(single)
        await third.reconfigure([])
        await wait_until(third, lambda: daemon_pid(single) is None, 10)


def test_a_whole_gpu_daemon_is_started_and_recorded_as_before(sock_dir: Path) -> None:
    """A daemon an older agent started must read as the same daemon after an upgrade: a
    whole-GPU spec keeps `-d` alone, no CUDA_VISIBLE_DEVICES, and the record's old keys."""
    spec = daemon_spec("k", str(sock_dir), [(GPU, 0)])
    assert (spec.start_args, spec.mig_uuids, spec.multi_user) == (("-d",), (), False)


def test_the_fake_refuses_arguments_it_does_not_know(capsys: object) -> None:
    assert fake_main(["-d", "-X"]) == 2
    assert fake_main(["-M"]) == 2
