"""Every log line the agent writes is an event: a name, then key=values (`gpuslice.logs`),
so an operator can filter by `event=` and a JSON pipeline gets fields, not free text such
as "MPS daemon for nvidia.com/gpu started on GPU-... with ...". Checked on the source: each
logging call's message is an event name (or an older `event=name key=%s` line)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuslice"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
EVENT = re.compile(r"^(?:[a-z][a-z0-9]*(?:-[a-z0-9]+)*|event=[a-z][a-z0-9-]*(?: .*)?)$")


def _is_logger(node: ast.expr) -> bool:
    """`log`, `logger`, `self._log`, `get_logger(...)`: a receiver named for a logger."""
    if isinstance(node, ast.Name):
        return "log" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "log" in node.attr.lower()
    if isinstance(node, ast.Call):
        return _is_logger(node.func)
    return False


def free_text_calls() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and _is_logger(node.func.value)
                and node.args
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.JoinedStr):  # f"dra-{what}-raised": its fixed parts
                text = "".join(
                    str(v.value) if isinstance(v, ast.Constant) else "x" for v in first.values
                )
            elif isinstance(first, ast.Constant) and isinstance(first.value, str):
                text = first.value
            else:
                continue
            if not EVENT.match(text):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {text!r}")
    return found


def test_every_log_call_is_an_event_with_fields() -> None:
    assert free_text_calls() == []
