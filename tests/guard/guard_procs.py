"""Real child processes standing in for a pod's GPU processes, and a fake /proc cgroup tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

POD_A = "1f3a5c7e-0000-4000-8000-00000000000a"
POD_B = "1f3a5c7e-0000-4000-8000-00000000000b"
AGENT_POD = "1f3a5c7e-0000-4000-8000-0000000000ff"
CTR_A = "a" * 64
CTR_A2 = "c" * 64
CTR_B = "b" * 64


def cgroup_line(pod_uid: str, container_id: str) -> str:
    slice_uid = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


def put(proc_root: Path, pid: int, text: str) -> None:
    d = proc_root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(text, encoding="utf-8")


def in_pod(proc_root: Path, pid: int, pod_uid: str, container_id: str) -> None:
    put(proc_root, pid, cgroup_line(pod_uid, container_id))


def sleeper() -> subprocess.Popen[bytes]:
    """A child that runs until signalled (it does not handle SIGTERM, so the default
    action ends it and its return code names the signal)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
