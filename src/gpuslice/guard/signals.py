"""Signalling a container's GPU processes without ever hitting the wrong process.

Three things can go wrong between a poll and a signal, and each is closed here:

* the PID exited and was reused by an unrelated process: the signal goes through a pidfd
  (`os.pidfd_open` then `signal.pidfd_send_signal`), which names one process, not a number;
  the cgroup is read *after* the pidfd is opened, so while the pidfd's process is alive
  that read describes it, and if it died meanwhile the signal fails with ESRCH and hits
  nobody;
* the process left the pod's cgroup (or was never in it): `/proc/<pid>/cgroup` is parsed
  again right before signalling and must name the target pod (and container, when known);
* the target is the agent's own pod: refused whatever the policy said, and a process
  outside any pod cgroup (a host daemon, the MPS server) is never signalled.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuslice.core.cgroups import ContainerId, PodUid, parse_cgroup
from gpuslice.logs import get_logger

log = get_logger("gpuslice.guard")

SkipReason = Literal["gone", "not-in-a-pod", "moved", "own-pod", "unreadable"]


@dataclass(frozen=True, slots=True)
class Target:
    """Whose processes may be signalled: the pod (and container) seen at poll time."""

    pod_uid: PodUid
    container_id: ContainerId | None = None


@dataclass(frozen=True, slots=True)
class SignalReport:
    signalled: tuple[int, ...] = ()
    skipped: tuple[tuple[int, SkipReason], ...] = field(default=())


def own_pod_uid(proc_root: Path = Path("/proc"), given: str = "") -> PodUid | None:
    """The agent's own pod: `given` (the `POD_UID` setting, from the downward API) or,
    where that is empty, its own cgroup path."""
    if given.strip():
        return PodUid(given.strip())
    text = _read_cgroup(proc_root / "self")
    identity = parse_cgroup(text) if text is not None else None
    return identity.pod_uid if identity is not None else None


def _read_cgroup(pid_dir: Path) -> str | None:
    try:
        return (pid_dir / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


class ProcessSignaller:
    """Sends signals to a pod's processes through pidfds, after checking their cgroup."""

    def __init__(self, proc_root: Path = Path("/proc"), own_pod: PodUid | None = None) -> None:
        self.proc_root = proc_root
        """Where `<pid>/cgroup` is read (the host's /proc under hostPID; a fake tree in tests).
        PIDs are those of the agent's PID namespace, so it must be the same namespace."""
        self.own_pod = own_pod

    def send(self, target: Target, pids: Iterable[int], sig: signal.Signals) -> SignalReport:
        signalled: list[int] = []
        skipped: list[tuple[int, SkipReason]] = []
        for pid in sorted(set(pids)):
            reason = self._send_one(target, pid, sig)
            if reason is None:
                signalled.append(pid)
            else:
                skipped.append((pid, reason))
                log.info(
                    "guard-signal-skipped",
                    pid=pid,
                    pod_uid=target.pod_uid,
                    signal=sig.name,
                    reason=reason,
                )
        return SignalReport(tuple(signalled), tuple(skipped))

    def _send_one(self, target: Target, pid: int, sig: signal.Signals) -> SkipReason | None:
        if self.own_pod is not None and target.pod_uid == self.own_pod:
            return "own-pod"
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return "gone"
        except OSError:
            return "unreadable"
        try:
            text = _read_cgroup(self.proc_root / str(pid))
            if text is None:
                return "gone"
            identity = parse_cgroup(text)
            if identity is None:
                return "not-in-a-pod"
            if self.own_pod is not None and identity.pod_uid == self.own_pod:
                return "own-pod"
            if identity.pod_uid != target.pod_uid:
                return "moved"
            if target.container_id is not None and identity.container_id != target.container_id:
                return "moved"
            try:
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                return "gone"
            return None
        finally:
            os.close(fd)
