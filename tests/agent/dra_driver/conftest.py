"""The DRA driver tests' rig fixture (tests/agent/dra_driver/rig.py holds the rig)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.sharing.plan import build_plan
from gpuslice.emulator.dra_store import DraStore
from gpuslice.state import PlanState
from tests.agent.dra_driver.rig import DRIVER, GPU_CLASS, NODE, Rig


@pytest.fixture
def make_rig(sock_dir: Path) -> Callable[..., Awaitable[Rig]]:
    async def make(node: str = "sim:2xh100-80gb", config: str = "version: v1\n") -> Rig:
        backend = open_backend(node)
        try:
            inventory = backend.inventory()
        finally:
            backend.close()
        state = PlanState(build_plan(inventory, parse_config(config)), inventory)
        store = DraStore(NODE, DRIVER)
        store.add_device_class(GPU_CLASS)
        rig = Rig(store, state, sock_dir)
        await rig.publish()
        return rig

    return make
