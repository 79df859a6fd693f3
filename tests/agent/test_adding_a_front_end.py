"""docs/architecture.md, "Adding things", walked for a front end: on a copy of the source,
a throwaway third front end (a CDI-only device plugin that serves nothing) is written as
its module and its registration, and the files that changed are counted. Issue 42: the
seam was the union of both front ends' special cases, and the mode was asked as
`settings.dra is None` in build.py, node_lock.py and cli/plugin.py; now the count is the
module and the registry, and the copy builds an agent around the new front end, takes
the node lock in its directory and names its mode on the start line."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
AGENT = "src/gpuslice/agent"

MODULE = '''"""A throwaway front end: a device plugin handing devices only through CDI, chosen when
the operator's flags ask for CDI device lists; it serves nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from gpuslice.agent.front import FrontEndKind, FrontEndParts, ModeOf
from gpuslice.agent.settings import AgentSettings
from gpuslice.core.caps import ContainerCaps
from gpuslice.core.devices import Inventory
from gpuslice.core.guard.model import ClaimOverride, GuardMode
from gpuslice.core.sharing.model import Plan
from gpuslice.kubelet.servicer import AllocateObserver
from gpuslice.podresources import PodResourcesClient
from gpuslice.state import PlanState

if TYPE_CHECKING:
    from gpuslice.agent.runner import Agent
    from gpuslice.mps import MpsDaemonManager


class CdiOnlyFrontEnd:
    def __init__(self, state: PlanState) -> None:
        self._state = state
        self.on_allocate: AllocateObserver | None = None
        self.caps: ContainerCaps | None = None

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()

    def readiness(self) -> tuple[bool, str]:
        return True, "ready: serving nothing\\n"

    def attributed_plan(self) -> tuple[Plan, Inventory] | None:
        snap = self._state.current
        return snap.plan, snap.inventory

    def guard_modes(self, node: GuardMode, override: ClaimOverride) -> ModeOf | None:
        return None

    def plan_warnings(self, plan: Plan) -> tuple[str, ...]:
        return plan.warnings

    def take_caps(self, caps: ContainerCaps) -> None:
        self.caps = caps

    def assignments(self, socket: Path) -> PodResourcesClient:
        return PodResourcesClient(socket)

    def wire_mps(self, agent: Agent) -> MpsDaemonManager | None:
        return None


def _selected(settings: AgentSettings) -> bool:
    return settings.overrides.get("flags.plugin.deviceListStrategy") == ["cdi-cri"]


def _build(parts: FrontEndParts) -> CdiOnlyFrontEnd:
    return CdiOnlyFrontEnd(parts.state)


def _lock_dir(settings: AgentSettings) -> Path:
    return settings.plugin_dir / "cdi-only"


KIND = FrontEndKind(name="cdi-only", selected=_selected, build=_build, lock_dir=_lock_dir)
'''

BUILD_IT = """
import asyncio, sys
from pathlib import Path
from gpuslice.agent.build import build_agent
from gpuslice.agent.cdi_front import CdiOnlyFrontEnd
from gpuslice.agent.front_ends import front_end_of
from gpuslice.agent.node_lock import node_lock_path
from gpuslice.agent.settings import AgentSettings

plugins = Path(sys.argv[1])
settings = AgentSettings(
    node="sim:1xa100-40gb",
    plugin_dir=plugins,
    metrics_port=None,
    health_port=None,
    labels_mode="none",
    overrides={"flags.plugin.deviceListStrategy": ["cdi-cri"]},
)

async def main() -> None:
    async with build_agent(settings) as agent:
        assert isinstance(agent.front_end, CdiOnlyFrontEnd), agent.front_end
        assert agent.front_end.caps is not None  # the caps wiring handed it the node's caps
        assert agent.readiness() == (True, "ready: serving nothing\\n")

asyncio.run(main())
assert front_end_of(settings).name == "cdi-only"
assert node_lock_path(settings) == plugins / "cdi-only" / "gpuslice.lock"
assert front_end_of(AgentSettings(node="sim:1xa100-40gb")).name == "device-plugin"
"""


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_a_new_front_end_is_its_module_and_its_registration(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "src" / "gpuslice", root / "src" / "gpuslice", ignore=ignore)
    before = _files(root)

    # 1. its module
    (root / AGENT / "cdi_front.py").write_text(MODULE)
    # 2. its registration
    registry = root / AGENT / "front_ends.py"
    text = registry.read_text()
    assert "    dra_front.KIND,\n" in text
    text = text.replace(
        "from gpuslice.agent import dra_front, front",
        "from gpuslice.agent import cdi_front, dra_front, front",
    )
    text = text.replace("    dra_front.KIND,\n", "    cdi_front.KIND,\n    dra_front.KIND,\n")
    registry.write_text(text)

    after = _files(root)
    touched = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert touched == [f"{AGENT}/cdi_front.py", f"{AGENT}/front_ends.py"]
    built = subprocess.run(
        [sys.executable, "-c", BUILD_IT, str(tmp_path / "plugins")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
        cwd=tmp_path,
        check=False,
    )
    assert built.returncode == 0, built.stderr


def _dra_reads(path: Path) -> list[str]:
    """Each read of DRA's settings group (`settings.dra`, `self.dra` in the settings) in
    the module."""
    tree = ast.parse(path.read_text())
    return [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "dra"
        and ast.unparse(node.value) in ("settings", "self.settings", "self")
    ]


def test_only_the_dra_front_end_asks_for_the_dra_settings() -> None:
    """The mode is the registry's answer: the DRA group is read by its own front end and
    by the settings' rules (the CLI fills it from `--dra`), nowhere else."""
    src = ROOT / "src"
    found = {
        str(p.relative_to(src)): reads
        for p in sorted((src / "gpuslice").rglob("*.py"))
        if (reads := _dra_reads(p))
    }
    assert found == {
        "gpuslice/agent/dra_front.py": ["settings.dra", "settings.dra", "settings.dra"],
        "gpuslice/agent/settings.py": ["self.dra"],
    }
