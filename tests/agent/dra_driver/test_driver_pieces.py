"""The DRA driver's pieces collaborate, none inheriting another (docs/architecture.md, DRA
mode): each reaches the others only through their public names, and only the sharing
piece holds the MPS manager and the claims' daemon specs, so a daemon is started, retuned
and quit in one place."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

from gpuslice.agent import (
    dra_driver,
    dra_prepare,
    dra_record,
    dra_sharing,
    dra_state,
    dra_unprepare,
)
from gpuslice.agent.dra_driver import DraDriver
from gpuslice.agent.dra_prepare import Preparer
from gpuslice.agent.dra_record import RecordKeeper
from gpuslice.agent.dra_sharing import ClaimSharing
from gpuslice.agent.dra_state import DriverEvents, DriverState
from gpuslice.agent.dra_unprepare import Unpreparer

PIECES = (DriverState, DriverEvents, ClaimSharing, Unpreparer, Preparer, RecordKeeper, DraDriver)
MODULES = (dra_state, dra_sharing, dra_unprepare, dra_prepare, dra_record, dra_driver)


def _tree(module: ModuleType) -> ast.Module:
    return ast.parse(Path(inspect.getfile(module)).read_text())


def test_no_piece_is_a_subclass_of_another() -> None:
    for piece in PIECES:
        assert piece.__bases__ == (object,), piece


def test_a_piece_reaches_another_only_through_its_public_names() -> None:
    private = []
    for module in MODULES:
        for node in ast.walk(_tree(module)):
            # self._<collaborator>._<name>
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"
            ):
                private.append(f"{module.__name__}:{node.lineno}: {ast.unparse(node)}")
    assert private == []


def test_only_the_sharing_piece_holds_the_mps_manager_and_the_daemons() -> None:
    holders = {
        module.__name__
        for module in MODULES
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.Attribute) and node.attr in ("_mps", "_daemons")
    }
    assert holders == {dra_sharing.__name__}
