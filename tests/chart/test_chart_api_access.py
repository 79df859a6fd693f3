"""The chart's RBAC, docs/install.md's "API access" table and the code, held to each other.

The table is where a reviewer sees why each verb is granted: one row per resource and scope
with its verbs, the values that grant it and, for every verb, the functions that use it.
Here the rendered chart must grant exactly the table's rows (no verb more, none fewer, each
only under its values), and every function the table names must exist and make that verb's
client call, so a verb whose code went away cannot stay documented, or granted, unnoticed.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from gpuslice.core.jsontypes import Json
from tests.chart.api_access import CODE, NO_CALLER, TABLE
from tests.chart.chart_support import render

# The lightkube AsyncClient method that makes each verb's request (server-side apply is a
# PATCH, a replace is an UPDATE; an eviction is a create on the pods/eviction subresource).
CLIENT_CALL: dict[str, tuple[str, ...]] = {
    "get": ("._client.get(",),
    # lists and watches go through `k8s.streams` (from the watch cache, with bookmarks)
    "list": ("._client.list(", "list_from_cache(", "list_page("),
    "watch": ("._client.watch(", "watch_from("),
    "create": ("._client.create(",),
    "update": ("._client.replace(",),
    "patch": ("._client.patch(", "._client.apply("),
    "delete": ("._client.delete(",),
}

# The table's "granted when" cells, each with values that grant the row and values that
# do not (everything else as in ALL_ON, so only that condition decides).
ALL_ON: Json = {
    "labels": {"mode": "api"},
    "metrics": {"enabled": True},
    "memoryGuard": {"mode": "enforce", "action": "evict"},
    "dra": {"enabled": True},
}
WHEN: dict[str, tuple[list[Json], list[Json]]] = {
    "always": ([{}], []),
    "`labels.mode: api`": ([{}], [{"labels": {"mode": "file"}}, {"labels": {"mode": "off"}}]),
    "`metrics.enabled` or `memoryGuard.mode` not `off`": (
        [{"metrics": {"enabled": False}}, {"memoryGuard": {"mode": "off"}}],
        [{"metrics": {"enabled": False}, "memoryGuard": {"mode": "off"}}],
    ),
    "`memoryGuard.action: evict`": (
        [{}],
        [
            {"memoryGuard": {"mode": "enforce", "action": "kill"}},
            {"memoryGuard": {"mode": "off", "action": "evict"}},
        ],
    ),
    "`dra.enabled`": ([{}], [{"dra": {"enabled": False}}]),
}


def granted(**values: Any) -> set[tuple[str, str, bool, str]]:
    """(API group, resource, namespaced, verb) for every verb the chart's roles grant the
    agent's service account."""
    result = render(**values)
    assert result.ok, result.problems
    out: set[tuple[str, str, bool, str]] = set()
    for m in result.manifests:
        if m["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in m["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add((group, resource, m["kind"] == "Role", verb))
    return out


def row_grants(row: Json) -> set[tuple[str, str, bool, str]]:
    return {(row["group"], row["resource"], row["namespaced"], v) for v in row["verbs"]}


def merged(base: Json, extra: Json) -> Json:
    out = {k: dict(v) for k, v in base.items()}
    for key, value in extra.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def test_the_chart_grants_exactly_the_tables_verbs() -> None:
    documented = set().union(*(row_grants(r) for r in TABLE))
    assert granted(**ALL_ON) == documented
    assert len(documented) == sum(len(r["verbs"]) for r in TABLE), "no verb in two rows"


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"{r['resource']}:{','.join(r['verbs'])}")
def test_each_row_is_granted_only_under_its_values(row: Json) -> None:
    assert row["when"] in WHEN, f"a new condition: add it to WHEN ({row['when']!r})"
    on, off = WHEN[row["when"]]
    for values in on:
        assert row_grants(row) <= granted(**merged(ALL_ON, values)), values
    for values in off:
        assert not row_grants(row) & granted(**merged(ALL_ON, values)), values


def _named(dotted: str) -> Any:
    """`gpuslice.k8s.dra.DraApi.get_claim` -> the function (or class) it names."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"{dotted}: no such module")


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"{r['resource']}:{','.join(r['verbs'])}")
def test_every_verb_names_code_that_makes_its_call(row: Json) -> None:
    """Each verb has its `verb:` part in "used by"; each function named there exists and
    calls the client method of that verb. "no caller yet" must be said, not implied."""
    split = (p.partition(":") for p in row["used_by"].split(";"))
    parts = {verb.strip(): text for verb, _, text in split}
    assert set(parts) == set(row["verbs"]), parts.keys()
    for verb, text in parts.items():
        names = [n for n in CODE.findall(text) if n.startswith("gpuslice.")]
        if not names:
            assert NO_CALLER in text, f"{row['resource']} {verb}: who uses it?"
            continue
        wanted = CLIENT_CALL[verb]
        for name in names:
            source = inspect.getsource(_named(name))
            assert any(c in source for c in wanted), f"{name} does not {verb}"


def test_no_device_classes_and_no_pod_get() -> None:
    """What the review took away: the agent never reads a DeviceClass (class configs come
    inside the claim's allocation) nor one pod by name."""
    everything = granted(**ALL_ON)
    assert not {g for g in everything if g[1] == "deviceclasses"}
    assert ("", "pods", False, "get") not in everything
    assert not {g for g in everything if g[0] == "resource.k8s.io" and g[3] == "patch"}
