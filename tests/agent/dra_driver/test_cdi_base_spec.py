"""The node's base CDI spec over the agent's life (`agent.cdi_base`): written once per
inventory under one name, looked for again while it cannot be written, warned about once per
reason, never removed."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import yaml

from gpuslice.agent.cdi_base import BaseSpec, DriverRoots
from gpuslice.backends import open_backend
from gpuslice.core.cdi.driver import BASE_ID
from gpuslice.core.config import parse_config
from gpuslice.core.sharing.plan import build_plan
from gpuslice.state import PlanState, Snapshot
from gpuslice.testing.driverroot import LIB_DIR, fake_driver_root, fake_hook
from gpuslice.testing.eventually import eventually
from gpuslice.testing.logcapture import captured_events

V = "550.54.15"


def _snapshot() -> Snapshot:
    backend = open_backend("sim:1xh100-80gb")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    assert inventory.driver_version == V
    return PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory).current


def _base(tmp_path: Path, *, hook: bool = True) -> tuple[BaseSpec, Path]:
    root = tmp_path / "drv"
    program = tmp_path / "toolkit" / "nvidia-cdi-hook"
    if hook:
        fake_hook(program)
    cdi = tmp_path / "cdi"
    return BaseSpec(cdi, DriverRoots(str(root), "/", str(program))), root


async def test_written_once_per_inventory_and_again_when_the_driver_changes(
    tmp_path: Path,
) -> None:
    base, root = _base(tmp_path)
    fake_driver_root(root, V)
    snap = _snapshot()
    path = tmp_path / "cdi" / "k8s.gpuslice.io-device_base.yaml"
    assert await base.cdi_id(snap) == BASE_ID
    written = path.stat().st_ino  # an atomic write replaces the inode
    assert await base.cdi_id(snap) == BASE_ID
    assert path.stat().st_ino == written  # the same node: not rewritten

    (root / LIB_DIR / "libcuda.so.570.1").write_bytes(b"")
    upgraded = replace(snap, inventory=replace(snap.inventory, driver_version="570.1"))
    assert await base.cdi_id(upgraded) == BASE_ID
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    paths = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert f"/{LIB_DIR}/libcuda.so.570.1" in paths
    assert f"/{LIB_DIR}/libcuda.so.{V}" not in paths


async def test_without_the_files_one_warning_then_the_spec_once_they_come(tmp_path: Path) -> None:
    base, root = _base(tmp_path)
    snap = _snapshot()
    with captured_events() as events:
        assert await base.cdi_id(snap) is None
        assert await base.cdi_id(snap) is None
        fake_driver_root(root, V)
        assert await base.cdi_id(snap) == BASE_ID
    (missing,) = [e for e in events if e["event"] == "dra-cdi-base-missing"]
    assert missing["log_level"] == "warning"
    assert missing["missing"] == f"libcuda.so.{V}, /dev/nvidiactl"
    assert "two claims" in missing["then"]
    assert [e["event"] for e in events if e["event"] == "dra-cdi-base-written"] == [
        "dra-cdi-base-written"
    ]


async def test_without_the_hook_program_no_base_spec(tmp_path: Path) -> None:
    base, root = _base(tmp_path, hook=False)
    fake_driver_root(root, V)
    with captured_events() as events:
        assert await base.cdi_id(_snapshot()) is None
    (missing,) = [e for e in events if e["event"] == "dra-cdi-base-missing"]
    assert "nvidia-cdi-hook at" in missing["missing"]
    assert not (tmp_path / "cdi").exists()


async def test_rewritten_when_a_new_inventory_is_published_without_a_prepare(
    tmp_path: Path,
) -> None:
    """A driver upgraded while the agent runs: the spec follows the snapshot at once."""
    base, root = _base(tmp_path)
    fake_driver_root(root, V)
    state = PlanState(_snapshot().plan, _snapshot().inventory)
    path = tmp_path / "cdi" / "k8s.gpuslice.io-device_base.yaml"
    assert await base.cdi_id(state.current) == BASE_ID  # as the record's load writes it

    def libraries() -> list[str]:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [m["containerPath"] for m in spec["containerEdits"]["mounts"]]

    stop = asyncio.Event()
    following = asyncio.create_task(base.follow(stop, state))
    try:
        (root / LIB_DIR / "libcuda.so.570.1").write_bytes(b"")
        upgraded = replace(state.current.inventory, driver_version="570.1")
        state.publish(inventory=upgraded)
        await eventually(
            lambda: f"/{LIB_DIR}/libcuda.so.570.1" in libraries(), "the new driver's spec"
        )
        assert f"/{LIB_DIR}/libcuda.so.{V}" not in libraries()
    finally:
        stop.set()
        await following
