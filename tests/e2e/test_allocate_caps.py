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

from gpuslice.podresources import PodResourcesEmulator
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.eventually import eventually_async
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


NODE_NAME = "gpu-node-1"
POD_UID = "11111111-2222-4333-8444-000000000001"
CID = "1" * 64


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root (NVML needs it)")
async def test_a_gpu_whose_limit_calls_fail_gets_no_hook_variables_until_they_work(
    sock_dir: Path,
) -> None:
    """Allocate reads the caps loop's view, not the one found at start: once a round sees
    the GPU's limit calls fail (NVML, retried with back-off), the next pod gets no
    variables, since the toolkit's hook would make the same call and fail the pod; once a
    retry confirms limits there again, the next pod gets them again."""
    cgroups, node_file = _node(sock_dir, cgroup_v2=True, driver="615.20")
    under = POD_UID.replace("-", "_")
    pod_dir = f"kubepods-burstable.slice/kubepods-burstable-pod{under}.slice"
    (cgroups / "kubepods.slice" / pod_dir / f"cri-containerd-{CID}.scope").mkdir(parents=True)
    pr_socket = sock_dir / "pr.sock"
    with running_apiserver() as api:
        api.add_node(NODE_NAME)
        api.add_pod("ml", "first", POD_UID, NODE_NAME, {"main": f"containerd://{CID}"})
        args = [
            "--no-labels", "--node-name", NODE_NAME,
            "--kubeconfig", str(api.write_kubeconfig(sock_dir / "kubeconfig")),
            "--cgroup-root", str(cgroups), "--pod-resources-socket", str(pr_socket),
            "--memory-caps=auto", "--memory-guard-interval=0.2",
        ]  # fmt: skip
        config = _config("cdi-cri")
        async with running_daemon(sock_dir, config, node=str(node_file), args=args) as node:
            kubelet = node.kubelet
            await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)

            async def hook_env(pod: str) -> dict[str, str]:
                admission = await kubelet.admit("ml", pod, [("main", {"nvidia.com/gpu": 1})])
                (container,) = admission.containers
                return {k: v for k, v in container.envs.items() if k in HOOK_ENV}

            async def logged(event: str) -> None:
                async def seen() -> bool:
                    return f"event={event} " in node.daemon.log()

                await eventually_async(seen, event, timeout=WAIT_S, explain=node.daemon.log)

            async with PodResourcesEmulator(pr_socket, kubelet.assignments):
                assert await hook_env("first") == dict.fromkeys(HOOK_ENV, SHARE_MIB)
                await logged("caps-applied")  # the loop holds the first pod's container
                node.control.fail_limits(0, "Unknown Error")
                await logged("caps-nvml-error")
                assert await hook_env("second") == {}
                node.control.fail_limits(0, None)
                await logged("caps-nvml-recovered")
                assert await hook_env("third") == dict.fromkeys(HOOK_ENV, SHARE_MIB)
