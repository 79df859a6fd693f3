"""The one rule for what the toolkit's memory-limits hook is given (`core.cdi.hook`), shared
by DRA's claim specs and the device plugin's Allocate: no second carrier of it."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuslice.core.caps import MemoryLimits
from gpuslice.core.cdi.hook import hook_env_for
from gpuslice.core.units import MIB

SRC = Path(__file__).resolve().parents[3] / "src" / "gpuslice"
GIB = 1024 * MIB


def test_one_pair_shared_by_the_devices_reaches_the_hook() -> None:
    pair = MemoryLimits(11517 * MIB, 11517 * MIB)
    assert hook_env_for({"GPU-a": pair, "GPU-b": pair}) == {
        "NVIDIA_GPU_MEMORY_REQUEST": "11517",
        "NVIDIA_GPU_MEMORY_LIMIT": "11517",
    }


def test_different_pairs_none_or_a_refused_pair_give_the_hook_nothing() -> None:
    assert hook_env_for({"a": MemoryLimits(GIB, GIB), "b": MemoryLimits(2 * GIB, 2 * GIB)}) == {}
    assert hook_env_for({}) == {}
    assert hook_env_for({"a": MemoryLimits(2 * GIB, GIB)}) == {}  # the hook would refuse it


def test_only_the_cdi_room_turns_limits_into_the_hooks_variables() -> None:
    """Both front ends ask `hook_env_for`; none builds the pair or its env itself."""
    private = {"hook_env", "hook_limits", "CapsRequestError"}
    users: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel == "core/cdi/hook.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "gpuslice.core.cdi.hook":
                names = {a.name for a in node.names} & private
                if names:
                    users[rel] = names
    assert users == {}
    callers = {
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if "hook_env_for(" in path.read_text() and path.name != "hook.py"
    }
    assert callers == {"core/cdi/spec.py", "core/allocation/caps.py"}
