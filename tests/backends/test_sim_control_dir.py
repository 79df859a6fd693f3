"""Driving a simulated backend through its control directory, in-process and from outside."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.backends import open_backend
from gpuslice.backends.simulated import ControlDir, SimulatedBackend
from gpuslice.core.caps import MemoryLimits
from gpuslice.core.health import HealthEvent
from gpuslice.core.units import MIB
from gpuslice.ports import MemoryLimitsError


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatedBackend]:
    backend = open_backend("sim:2xt4,1xa30/mig=2g.12gb*2", control_dir=tmp_path / "ctl")
    assert isinstance(backend, SimulatedBackend)
    try:
        yield backend
    finally:
        backend.close()


def test_the_callers_directory_is_polled(sim: SimulatedBackend, tmp_path: Path) -> None:
    assert sim.control_dir == tmp_path / "ctl"
    assert (tmp_path / "ctl" / "events").is_dir()


def test_commands_apply_once_in_order(sim: SimulatedBackend, tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path / "ctl")
    gpus = sim.inventory().gpus
    ctl.inject_xid(1, 79)
    ctl.inject_recovery(gpus[1].uuid)
    ctl.inject_xid(2, 94, gi_id=gpus[2].mig_devices[0].gi_id, ci_id=0)
    ctl.inject_lost(0)
    got = [sim.wait_health_event(5.0) for _ in range(4)]
    assert got == [
        HealthEvent("xid", gpus[1].uuid, xid=79),
        HealthEvent("recovered", gpus[1].uuid),
        HealthEvent("xid", gpus[2].uuid, xid=94, gi_id=gpus[2].mig_devices[0].gi_id, ci_id=0),
        HealthEvent("lost", gpus[0].uuid),
    ]
    assert ctl.pending() == []
    assert ctl.rejected() == []
    assert sim.wait_health_event(0.1) is None


def test_processes_and_status_commands(sim: SimulatedBackend, tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path / "ctl")
    a30 = sim.inventory().gpus[2]
    ctl.add_process(7, 0, used_memory_mib=256, sm_util_percent=12, mps=True)
    ctl.add_process(8, a30.uuid, mig=1, used_memory_mib=1024)
    ctl.set_status(0, gpu_util_percent=50, power_w=33)
    procs = {p.pid: p for p in sim.processes()}
    assert procs[7].used_memory_bytes == 256 * MIB
    assert procs[7].is_mps_client
    assert procs[8].mig_uuid == a30.mig_devices[1].uuid
    status = sim.statuses()[0]
    assert (status.memory_used_mib, status.gpu_util_percent, status.power_w) == (256, 50, 33.0)
    ctl.remove_process(7)
    assert [p.pid for p in sim.processes()] == [8]


def test_bad_commands_are_rejected_not_lost(sim: SimulatedBackend, tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path / "ctl")
    ctl.inject_xid(9, 79)  # no GPU 9
    ctl.send({"kind": "reboot", "gpu": 0})
    (ctl.events / "0-garbage.json").write_text("{not json")
    ctl.inject_xid(0, 48)  # good commands after bad ones still apply
    event = sim.wait_health_event(5.0)
    assert event == HealthEvent("xid", sim.inventory().gpus[0].uuid, xid=48)
    assert len(ctl.rejected()) == 3
    assert ctl.pending() == []


CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from gpuslice.backends import open_backend

    backend = open_backend(sys.argv[1], control_dir=Path(sys.argv[2]))
    print(json.dumps({"ready": [g.uuid for g in backend.inventory().gpus]}), flush=True)
    event = backend.wait_health_event(30.0)
    procs = [(p.pid, p.gpu_uuid, p.used_memory_bytes) for p in backend.processes()]
    print(json.dumps({"event": None if event is None else [event.kind, event.gpu_uuid,
                      event.xid], "processes": procs}), flush=True)
    backend.close()
    """
)


def test_a_separate_process_receives_injected_xids(tmp_path: Path) -> None:
    """The way end-to-end tests drive the daemon: the directory named at start (the daemon's
    `GPUSLICE_SIM_CONTROL_DIR`), files through it."""
    control = tmp_path / "ctl"
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, "sim:2xl40s", str(control)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        ready = json.loads(child.stdout.readline())["ready"]
        ctl = ControlDir(control)
        ctl.add_process(31337, 1, used_memory_mib=64)
        # Only then the XID: the child wakes on it, so the process is applied by then.
        deadline = time.monotonic() + 10
        while ctl.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        ctl.inject_xid(ready[1], 79)
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    result = json.loads(out)
    assert result["event"] == ["xid", ready[1], 79]
    assert result["processes"] == [[31337, ready[1], 64 * MIB]]
    assert ctl.pending() == []


def test_mig_command_changes_mode_and_layout_live(sim: SimulatedBackend, tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path / "ctl")
    a30 = sim.inventory().gpus[2]
    ctl.set_mig(2, enabled=True, layout="1g.6gb*4")
    after = sim.inventory().gpus[2]
    assert after.uuid == a30.uuid
    assert [m.profile for m in after.mig_devices] == ["1g.6gb"] * 4
    ctl.set_mig(2, enabled=False)
    off = sim.inventory().gpus[2]
    assert not off.mig_enabled
    assert off.mig_devices == ()
    ctl.set_mig(2, enabled=True)  # MIG mode on, no instances yet
    assert sim.inventory().gpus[2].mig_enabled
    assert sim.inventory().gpus[2].mig_devices == ()
    # A layout that does not fit, or MIG on a T4, is rejected and changes nothing.
    ctl.set_mig(2, enabled=True, layout="4g.24gb*2")
    ctl.set_mig(0, enabled=True, layout="1g.6gb")
    inv = sim.inventory()
    assert len(ctl.rejected()) == 2
    assert inv.gpus[2].mig_devices == ()
    assert not inv.gpus[0].mig_enabled


CG = "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope"


def limits_sim(tmp_path: Path) -> SimulatedBackend:
    node = tmp_path / "node.yaml"
    node.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n')
    backend = open_backend(str(node), control_dir=tmp_path / "ctl")
    assert isinstance(backend, SimulatedBackend)
    return backend


def test_limits_and_used_memory_are_driven_from_outside(tmp_path: Path) -> None:
    """A test outside the agent's process makes the two cases the agent's read-back must
    catch: a container holding more than its hard limit (it allocated before the limit was
    set), and limits someone else changed or cleared; `used` is the cgroup's memory."""
    sim = limits_sim(tmp_path)
    try:
        ctl = ControlDir(tmp_path / "ctl")
        uuid = sim.inventory().gpus[0].uuid
        ctl.add_process(7, 0, used_memory_mib=30000, cgroup=CG)
        ctl.add_process(8, 0, used_memory_mib=500)  # in no cgroup: charged to none
        ctl.set_limits(0, CG, soft_mib=11517, hard_mib=11517)
        got = sim.get_memory_limits(uuid, CG)
        assert (got.soft_bytes, got.hard_bytes) == (11517 * MIB, 11517 * MIB)
        assert got.used_bytes == 30000 * MIB
        ctl.add_process(7, 0, used_memory_mib=9000, cgroup=CG)  # it freed some
        assert sim.get_memory_limits(uuid, CG).used_bytes == 9000 * MIB
        ctl.set_limits(0, CG, soft_mib=0, hard_mib=None)
        got = sim.get_memory_limits(uuid, CG)
        assert got.cleared
        ctl.set_limits(0, CG, soft_mib=100, hard_mib=200)
        ctl.clear_limits(0, CG)
        assert sim.get_memory_limits(uuid, CG).cleared
        assert sim.memory_limit_calls == 4  # the test's own reads; none of its writes
        ctl.set_limits(0, CG, soft_mib=100, hard_mib=200)
        ctl.cgroup_removed(CG)
        assert sim.get_memory_limits(uuid, CG).cleared
        assert ctl.rejected() == []
        ctl.send({"kind": "set_limits", "gpu": 0, "cgroup": "", "softMiB": 1, "hardMiB": 1})
        ctl.send({"kind": "set_limits", "gpu": 0, "cgroup": CG, "softMiB": -1, "hardMiB": 1})
        ctl.send({"kind": "clear_limits", "gpu": 0})
        sim.processes()
        assert len(ctl.rejected()) == 3
    finally:
        sim.close()


def test_a_grower_in_a_cgroup_fails_at_the_hard_limit_set_from_outside(tmp_path: Path) -> None:
    sim = limits_sim(tmp_path)
    try:
        ctl = ControlDir(tmp_path / "ctl")
        uuid = sim.inventory().gpus[0].uuid
        ctl.set_limits(0, CG, soft_mib=1000, hard_mib=1000)
        ctl.grow_process(9, 0, start_mib=4000, cgroup=CG)
        sim.processes()
        [(gpu, death)] = sim.oom_deaths()
        assert (gpu, death.pid, death.reason) == (uuid, 9, "hard-limit")
        ctl.grow_process(10, 0, start_mib=800, cgroup=CG)
        assert sim.get_memory_limits(uuid, CG).used_bytes == 800 * MIB
    finally:
        sim.close()


def test_limit_calls_are_made_to_fail_from_outside(tmp_path: Path) -> None:
    """The NVML error a daemon's caps loop must back off from, and its end."""
    sim = limits_sim(tmp_path)
    try:
        ctl = ControlDir(tmp_path / "ctl")
        uuid = sim.inventory().gpus[0].uuid
        ctl.fail_limits(0, "GPU is lost")
        with pytest.raises(MemoryLimitsError, match="GPU is lost") as failed:
            sim.get_memory_limits(uuid, CG)
        assert failed.value.refusal == "nvml-error"
        with pytest.raises(MemoryLimitsError):
            sim.set_memory_limits(uuid, CG, MemoryLimits(MIB, MIB))
        ctl.fail_limits(uuid, None)
        assert sim.get_memory_limits(uuid, CG).cleared
        ctl.send({"kind": "fail_limits", "gpu": 0, "error": 5})
        sim.processes()
        assert len(ctl.rejected()) == 1
        assert sim.get_memory_limits(uuid, CG).cleared
    finally:
        sim.close()
