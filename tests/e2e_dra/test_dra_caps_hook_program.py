"""The toolkit's hook program is checked at every Prepare (issue 40 item 8), through the
daemon process in DRA mode: a program that is not executable gets no hook (the runtime
would fail the container); one installed after the agent started is written into the next
claim's CDI spec; one removed is not written any more. The program is looked for where the
agent sees it (`--memory-caps-hook-seen-at`, the chart's mount of the host's directory)
and written as the host's path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e.guard_support import CONFIG
from tests.e2e_dra.dra_node import claim_obj, request, running_dra_node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent caps only as root")

HOST_PATH = "/usr/bin/nvidia-cdi-hook"


def _hooks(node: Any, uid: str) -> list[Json]:
    [device] = node.cdi_spec(uid)["devices"]
    return list(device["containerEdits"].get("hooks", []))


async def test_the_hook_follows_the_program_appearing_and_going(
    sock_dir: Path, api: FakeApiServer
) -> None:
    cgroups = sock_dir / "cgroup"
    cgroups.mkdir()
    (cgroups / "cgroup.controllers").write_text("cpu memory\n")
    (cgroups / "kubepods.slice").mkdir()
    seen = sock_dir / "host-bin"
    seen.mkdir()
    program = seen / "nvidia-cdi-hook"
    program.write_text("#!/bin/sh\nexit 0\n")  # there, but not executable
    node_file = sock_dir / "node.yaml"
    node_file.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n')
    args = [
        "--cgroup-root", str(cgroups), "--memory-caps-hook-path", HOST_PATH,
        "--memory-caps-hook-seen-at", str(program),
    ]  # fmt: skip
    async with running_dra_node(
        sock_dir, api, node=str(node_file), config=CONFIG, args=args
    ) as node:

        async def prepared(name: str) -> list[Json]:
            ref = node.allocate(claim_obj(name, [request("gpu")]))
            result = (await node.prepare(ref))[ref.uid]
            assert not result.error
            return _hooks(node, ref.uid)

        assert await prepared("before") == []  # not executable
        program.chmod(0o755)
        [hook] = await prepared("installed")
        assert hook["path"] == HOST_PATH  # the host's path, which the runtime runs
        program.unlink()
        assert await prepared("removed") == []


async def test_a_program_installed_after_start_is_used(sock_dir: Path, api: FakeApiServer) -> None:
    """The same at the hook's own path (`--memory-caps-hook-path` only, as run by hand)."""
    cgroups = sock_dir / "cgroup"
    cgroups.mkdir()
    (cgroups / "cgroup.controllers").write_text("cpu memory\n")
    (cgroups / "kubepods.slice").mkdir()
    program = sock_dir / "bin" / "nvidia-cdi-hook"
    program.parent.mkdir()
    node_file = sock_dir / "node.yaml"
    node_file.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n')
    args = ["--cgroup-root", str(cgroups), "--memory-caps-hook-path", str(program)]
    async with running_dra_node(
        sock_dir, api, node=str(node_file), config=CONFIG, args=args
    ) as node:
        first = node.allocate(claim_obj("first", [request("gpu")]))
        assert not (await node.prepare(first))[first.uid].error
        assert _hooks(node, first.uid) == []
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
        second = node.allocate(claim_obj("second", [request("gpu")]))
        assert not (await node.prepare(second))[second.uid].error
        [hook] = _hooks(node, second.uid)
        assert hook["path"] == str(program)
