"""The toolkit's hook variables in the real daemon's Allocate, over gRPC through the emulated
kubelet: a time-sliced share of a simulated L40S whose driver has the limits calls (r615),
on a node whose cgroup v2 tree is a temp directory, gets `NVIDIA_GPU_MEMORY_REQUEST` and
`NVIDIA_GPU_MEMORY_LIMIT` (its share, 46068 / 4 = 11517 MiB) when the device reaches the
container through CDI, so the toolkit's hook caps it before it runs. Nowhere else: on
cgroup v1 the hook would fail the pod, an older driver cannot cap, `envvar` brings no
toolkit spec (and so no hook), and an exclusive GPU has nobody to protect."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.guard_support import WAIT_S

HOOK_ENV = ("NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_REQUEST")
SHARE_MIB = str(46068 // 4)


def _config(strategy: str, replicas: int = 4) -> str:
    sharing = (
        f"sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
        f"      replicas: {replicas}\n"
        if replicas > 1
        else ""
    )
    return f"version: v1\nflags:\n  plugin:\n    deviceListStrategy: [{strategy}]\n{sharing}"


def _node(workdir: Path, *, cgroup_v2: bool, driver: str) -> tuple[Path, Path]:
    """(the cgroup root, the simulated node's file)."""
    cgroups = workdir / "cgroup"
    cgroups.mkdir(parents=True)
    if cgroup_v2:
        (cgroups / "cgroup.controllers").write_text("cpu memory pids\n")
        (cgroups / "kubepods.slice").mkdir()  # the host's tree: the kubelet's pods are there
    node_file = workdir / "node.yaml"
    node_file.write_text(f'driverVersion: "{driver}"\ngpus:\n  - model: l40s\n')
    return cgroups, node_file


async def _allocated_env(
    workdir: Path, *, strategy: str, cgroup_v2: bool, driver: str, replicas: int
) -> dict[str, str]:
    cgroups, node_file = _node(workdir, cgroup_v2=cgroup_v2, driver=driver)
    args = ["--no-labels", "--cgroup-root", str(cgroups), "--memory-caps=auto"]
    config = _config(strategy, replicas)
    async with running_daemon(workdir, config, node=str(node_file), args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == replicas, WAIT_S)
        admission = await kubelet.admit("ml", "p", [("main", {"nvidia.com/gpu": 1})])
    (container,) = admission.containers
    return container.envs


CASES = [
    # (strategy, cgroup v2, driver, replicas): the hook's variables, or why none
    (("cdi-cri", True, "615.20", 4), None),
    (("cdi-annotations", True, "615.20", 4), None),
    (("cdi-cri", False, "615.20", 4), "cgroup v1: the hook would fail the container"),
    (("cdi-cri", True, "580.95.05", 4), "a driver before r615 cannot cap"),
    (("envvar", True, "615.20", 4), "no CDI: no toolkit spec, no hook"),
    (("cdi-cri", True, "615.20", 1), "an exclusive GPU has nobody to protect"),
]


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root (NVML needs it)")
async def test_the_hook_variables_go_only_where_the_hook_caps(sock_dir: Path) -> None:
    for n, ((strategy, v2, driver, replicas), why_not) in enumerate(CASES):
        envs = await _allocated_env(
            sock_dir / str(n), strategy=strategy, cgroup_v2=v2, driver=driver, replicas=replicas
        )
        got = {k: envs[k] for k in HOOK_ENV if k in envs}
        if why_not is None:
            assert got == dict.fromkeys(HOOK_ENV, SHARE_MIB), strategy
            assert envs["GPUSLICE_MEMORY_LIMIT_MIB"] == SHARE_MIB  # the hint agrees
        else:
            assert got == {}, why_not
