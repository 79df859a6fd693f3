"""The signaller against real child processes and a fake /proc cgroup tree."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.core.cgroups import ContainerId, PodUid
from gpuslice.guard import ProcessSignaller, Target
from tests.guard.guard_procs import (
    AGENT_POD,
    CTR_A,
    CTR_A2,
    CTR_B,
    POD_A,
    POD_B,
    in_pod,
    put,
    sleeper,
)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def spawn(children: list[subprocess.Popen[bytes]], n: int) -> list[subprocess.Popen[bytes]]:
    new = [sleeper() for _ in range(n)]
    children.extend(new)
    return new


def alive(p: subprocess.Popen[bytes]) -> bool:
    return p.poll() is None


TARGET_A = Target(PodUid(POD_A), ContainerId(CTR_A))


def test_only_the_pods_processes_are_signalled(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    a1, a2, b, host = spawn(children, 4)
    in_pod(tmp_path, a1.pid, POD_A, CTR_A)
    in_pod(tmp_path, a2.pid, POD_A, CTR_A)
    in_pod(tmp_path, b.pid, POD_B, CTR_B)
    put(tmp_path, host.pid, "0::/system.slice/nvidia-persistenced.service\n")
    signaller = ProcessSignaller(tmp_path, own_pod=PodUid(AGENT_POD))
    # The policy's PID list is stale or wrong on purpose: b and host must survive anyway.
    report = signaller.send(TARGET_A, [a1.pid, a2.pid, b.pid, host.pid], signal.SIGTERM)
    assert report.signalled == tuple(sorted([a1.pid, a2.pid]))
    assert dict(report.skipped) == {b.pid: "moved", host.pid: "not-in-a-pod"}
    assert a1.wait(10) == -signal.SIGTERM
    assert a2.wait(10) == -signal.SIGTERM
    assert alive(b)
    assert alive(host)


def test_a_process_that_moved_out_of_the_container_is_not_signalled(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    (p,) = spawn(children, 1)
    in_pod(tmp_path, p.pid, POD_A, CTR_A)
    signaller = ProcessSignaller(tmp_path)
    in_pod(tmp_path, p.pid, POD_A, CTR_A2)  # re-read just before signalling: another container
    report = signaller.send(TARGET_A, [p.pid], signal.SIGKILL)
    assert report.signalled == ()
    assert report.skipped == ((p.pid, "moved"),)
    assert alive(p)
    # Without a container ID the pod is the boundary: the same process is then fair game.
    report = signaller.send(Target(PodUid(POD_A)), [p.pid], signal.SIGKILL)
    assert report.signalled == (p.pid,)
    assert p.wait(10) == -signal.SIGKILL


def test_an_exited_pid_is_never_signalled_even_if_its_proc_entry_still_matches(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    (p,) = spawn(children, 1)
    in_pod(tmp_path, p.pid, POD_A, CTR_A)
    p.kill()
    p.wait()  # reaped: the number is free for reuse; pidfd_open refuses it
    report = ProcessSignaller(tmp_path).send(TARGET_A, [p.pid], signal.SIGTERM)
    assert report == type(report)((), ((p.pid, "gone"),))


def test_a_reused_pid_in_another_pod_is_never_signalled(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    # The policy saw PID n in pod A; by signal time n belongs to a new process in pod B
    # (what reuse looks like through /proc): the cgroup re-check refuses it.
    (newcomer,) = spawn(children, 1)
    in_pod(tmp_path, newcomer.pid, POD_B, CTR_B)
    report = ProcessSignaller(tmp_path).send(TARGET_A, [newcomer.pid], signal.SIGKILL)
    assert report.skipped == ((newcomer.pid, "moved"),)
    assert alive(newcomer)


def test_the_agents_own_pod_is_never_signalled(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    p, q = spawn(children, 2)
    in_pod(tmp_path, p.pid, AGENT_POD, CTR_A)
    in_pod(tmp_path, q.pid, AGENT_POD, CTR_A)
    signaller = ProcessSignaller(tmp_path, own_pod=PodUid(AGENT_POD))
    report = signaller.send(Target(PodUid(AGENT_POD)), [p.pid], signal.SIGKILL)
    assert report.skipped == ((p.pid, "own-pod"),)
    # Even a target naming another pod cannot reach a process that sits in the agent's pod.
    report = signaller.send(Target(PodUid(POD_A)), [q.pid], signal.SIGKILL)
    assert report.skipped == ((q.pid, "own-pod"),)
    assert alive(p)
    assert alive(q)


def test_own_pod_uid_from_env_or_own_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuslice.guard import own_pod_uid

    monkeypatch.setenv("POD_UID", AGENT_POD)
    assert own_pod_uid(tmp_path) == AGENT_POD
    monkeypatch.delenv("POD_UID")
    assert own_pod_uid(tmp_path) is None
    in_pod(tmp_path, 0, POD_B, CTR_B)
    (tmp_path / "0").rename(tmp_path / "self")
    assert own_pod_uid(tmp_path) == POD_B
