"""The API-access table of docs (what the agent may call, and which code calls it), read once
for the chart tests and the real API server's test."""

from __future__ import annotations

import re
from pathlib import Path

from gpuslice.core.jsontypes import Json

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"`([^`]+)`")
NO_CALLER = "no caller yet"


def access_table() -> list[Json]:
    """The rows of docs/install.md's "API access" table."""
    lines = (ROOT / "docs/install.md").read_text().splitlines()
    start = lines.index("### API access")
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert rows[0] == ["resource", "scope", "verbs", "granted when", "used by"], rows[0]
    out = []
    for resource, scope, verbs, when, used_by in rows[2:]:
        [name] = CODE.findall(resource)
        group, _, plural = (
            name.rpartition("/") if name.startswith("resource.k8s.io/") else ("", "", name)
        )
        out.append(
            {
                "group": group,
                "resource": plural,
                "namespaced": scope != "cluster",
                "verbs": CODE.findall(verbs),
                "when": when,
                "used_by": used_by,
            }
        )
    return out


TABLE = access_table()
