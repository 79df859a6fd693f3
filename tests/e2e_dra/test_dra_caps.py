"""Memory caps in DRA mode, through the daemon process: a claim on a share of a simulated
L40S (offered in 4 shares) is prepared with a CDI spec that carries the toolkit's
`apply-cuda-memory-limits` hook at `createRuntime` and the share's memory as
NVIDIA_GPU_MEMORY_REQUEST / LIMIT (MiB), where the node can take it: driver r615, cgroup v2
(a temp tree), the hook program at its path. With a driver before r615, or no hook program,
the same claim's spec has neither, and Prepare succeeds all the same."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.podresources import PodResourcesEmulator
from gpuslice.podresources.claims import ClaimBooks, ClaimDevice
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.eventually import eventually_async
from tests.e2e.guard_support import CONFIG, WAIT_S
from tests.e2e_dra.dra_node import DRIVER, NODE, claim_obj, request, running_dra_node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root")
SHARE_MIB = 46068 // 4


async def _spec(
    sock_dir: Path, api: FakeApiServer, driver: str, hook_there: bool
) -> tuple[list[Json], dict[str, str]]:
    """The claim's device's hooks and environment, as its CDI spec gives them."""
    cgroups = sock_dir / "cgroup"
    cgroups.mkdir()
    (cgroups / "cgroup.controllers").write_text("cpu memory\n")
    (cgroups / "kubepods.slice").mkdir()  # the host's tree: the kubelet's pods are there
    hook = sock_dir / "bin" / "nvidia-cdi-hook"
    hook.parent.mkdir()
    if hook_there:
        hook.write_text("#!/bin/sh\nexit 0\n")
        hook.chmod(0o755)
    node_file = sock_dir / "node.yaml"
    node_file.write_text(f'driverVersion: "{driver}"\ngpus:\n  - model: l40s\n')
    args = ["--cgroup-root", str(cgroups), "--memory-caps-hook-path", str(hook)]
    async with running_dra_node(
        sock_dir, api, node=str(node_file), config=CONFIG, args=args
    ) as node:
        ref = node.allocate(claim_obj("one", [request("gpu")]))
        result = (await node.prepare(ref))[ref.uid]
        assert not result.error
        [device] = node.cdi_spec(ref.uid)["devices"]
        edits = device["containerEdits"]
        env = dict(str(e).split("=", 1) for e in edits["env"])
        return list(edits.get("hooks", [])), env


async def test_a_share_gets_the_hook_and_its_memory_where_the_node_can_take_it(
    sock_dir: Path, api: FakeApiServer
) -> None:
    hooks, env = await _spec(sock_dir, api, "615.20", hook_there=True)
    [hook] = hooks
    assert hook["hookName"] == "createRuntime"
    assert hook["path"] == str(sock_dir / "bin" / "nvidia-cdi-hook")
    assert hook["args"][:3] == ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root"]
    assert hook["args"][-2] == "--gpu-id"
    assert hook["args"][-1].startswith("GPU-")
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == str(SHARE_MIB)
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == str(SHARE_MIB)


async def test_an_old_driver_gets_no_hook_and_prepares(sock_dir: Path, api: FakeApiServer) -> None:
    hooks, env = await _spec(sock_dir, api, "580.95.05", hook_there=True)
    assert hooks == []
    assert not [k for k in env if k.startswith("NVIDIA_GPU_MEMORY_")]


async def test_no_hook_program_no_hook(sock_dir: Path, api: FakeApiServer) -> None:
    """Without the program at the hook's path the runtime would fail the container: no hook
    (nor its variables) then; the agent applies the limits once the container runs."""
    hooks, env = await _spec(sock_dir, api, "615.20", hook_there=False)
    assert hooks == []
    assert not [k for k in env if k.startswith("NVIDIA_GPU_MEMORY_")]


async def test_unlimited_a_share_that_reserved_nothing_is_guaranteed_nothing(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """`--consumable-shares unlimited`: a claim of 20 GiB, then one asking for no memory.
    The second's spec asks the hook for soft 0 and, as hard limit, what the first left
    (46068 - 20480 MiB), not the whole GPU as both (issue 40, item 6)."""
    cgroups = sock_dir / "cgroup"
    cgroups.mkdir()
    (cgroups / "cgroup.controllers").write_text("cpu memory\n")
    (cgroups / "kubepods.slice").mkdir()  # the host's tree: the kubelet's pods are there
    hook = sock_dir / "bin" / "nvidia-cdi-hook"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    node_file = sock_dir / "node.yaml"
    node_file.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n')
    args = [
        "--cgroup-root", str(cgroups), "--memory-caps-hook-path", str(hook),
        "--consumable-shares", "unlimited",
    ]  # fmt: skip
    async with running_dra_node(sock_dir, api, node=str(node_file), args=args) as node:
        envs = {}
        sized = request("gpu", capacity={"requests": {"memory": "20Gi"}})
        for name, req in (("sized", sized), ("free", request("gpu"))):
            ref = node.allocate(claim_obj(name, [req]))
            assert not (await node.prepare(ref))[ref.uid].error
            [device] = node.cdi_spec(ref.uid)["devices"]
            envs[name] = dict(str(e).split("=", 1) for e in device["containerEdits"]["env"])
        assert envs["sized"]["NVIDIA_GPU_MEMORY_REQUEST"] == "20480"
        assert envs["sized"]["NVIDIA_GPU_MEMORY_LIMIT"] == "20480"
        assert envs["free"]["NVIDIA_GPU_MEMORY_REQUEST"] == "0"
        assert envs["free"]["NVIDIA_GPU_MEMORY_LIMIT"] == str(46068 - 20480)


async def test_a_gpu_whose_limit_calls_fail_gets_no_hook_until_they_work(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """Prepare reads the caps loop's view, as Allocate does: once a round sees the GPU's
    limit calls fail (NVML, retried with back-off), the next claim's spec has neither the
    hook nor its variables (the hook would make the same call and fail the pod); once a
    retry confirms limits there, the next claim's spec has them again."""
    cgroups = sock_dir / "cgroup"
    (cgroups / "kubepods.slice").mkdir(parents=True)
    (cgroups / "cgroup.controllers").write_text("cpu memory\n")
    uid, cid = "11111111-2222-4333-8444-000000000001", "1" * 64
    pod_dir = f"kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    (cgroups / "kubepods.slice" / pod_dir / f"cri-containerd-{cid}.scope").mkdir(parents=True)
    api.add_pod("ml", "first", uid, NODE, {"main": f"containerd://{cid}"})
    hook = sock_dir / "bin" / "nvidia-cdi-hook"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    node_file = sock_dir / "node.yaml"
    node_file.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n')
    pr_socket = sock_dir / "pr.sock"
    args = [
        "--cgroup-root", str(cgroups), "--memory-caps-hook-path", str(hook),
        "--pod-resources-socket", str(pr_socket), "--memory-guard-interval=0.2",
    ]  # fmt: skip
    books = ClaimBooks()
    async with (
        running_dra_node(sock_dir, api, node=str(node_file), config=CONFIG, args=args) as node,
        PodResourcesEmulator(pr_socket, claims=books),
    ):

        async def prepared(name: str) -> tuple[list[Json], list[str]]:
            claim = claim_obj(name, [request("gpu")])
            claim["metadata"]["namespace"] = "ml"
            ref = node.allocate(claim, pod_uid=uid if name == "first" else f"pod-{name}")
            result = (await node.prepare(ref))[ref.uid]
            assert not result.error
            if name == "first":
                (device,) = result.devices
                books.book(
                    "ml", "first", "main", "ml", name,
                    [ClaimDevice(DRIVER, NODE, device.device, device.share_id, device.cdi_ids)],
                )  # fmt: skip
            [device_spec] = node.cdi_spec(ref.uid)["devices"]
            edits = device_spec["containerEdits"]
            env = [str(e) for e in edits["env"] if str(e).startswith("NVIDIA_GPU_MEMORY_")]
            return list(edits.get("hooks", [])), sorted(env)

        async def logged(event: str) -> None:
            async def seen() -> bool:
                return f"event={event} " in node.log()

            await eventually_async(seen, event, timeout=WAIT_S, explain=node.log)

        pair = [f"NVIDIA_GPU_MEMORY_LIMIT={SHARE_MIB}", f"NVIDIA_GPU_MEMORY_REQUEST={SHARE_MIB}"]
        hooks, env = await prepared("first")
        assert (len(hooks), env) == (1, pair)
        await logged("caps-applied")  # the loop holds the first claim's container
        node.control.fail_limits(0, "Unknown Error")
        await logged("caps-nvml-error")
        assert await prepared("second") == ([], [])
        node.control.fail_limits(0, None)
        await logged("caps-nvml-recovered")
        hooks, env = await prepared("third")
        assert (len(hooks), env) == (1, pair)
