"""The shipped Grafana dashboard is well-formed and only queries series the exporter emits."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.metrics import SnapshotRefresher, exporter_registry
from gpuslice.ports import ContainerDevices
from tests.metrics.metrics_fixtures import (
    A100_MIG,
    INVENTORY,
    L40S,
    MIG_1G,
    MIG_1G_RES,
    SHARED,
    T4,
    ScriptedBackend,
    build_plan,
    container_id,
    default_statuses,
    proc,
    uid,
    v2_systemd_containerd,
    write_proc,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpuslice-dashboard.json"
METRIC = re.compile(r"\b(DCGM_FI_DEV_\w+|gpuslice_\w+)")


class Books:
    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        return (
            ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",)),
            ContainerDevices("lab", "tiny", "nb", MIG_1G_RES, (MIG_1G,)),
        )


async def exported_series(tmp_path: Path) -> dict[str, set[str]]:
    """Sample name -> label names, from a scrape with every kind of series present."""
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    backend = ScriptedBackend(
        gpu_statuses=default_statuses(),
        gpu_processes=[proc(101, T4, 100, sm=5), proc(7, L40S, 1), proc(8, A100_MIG, 1)],
    )
    refresher = SnapshotRefresher(
        backend=backend,
        assignments=Books(),
        current=lambda: (build_plan(), INVENTORY),
        hostname="n1",
        proc_root=tmp_path,
    )
    await refresher.refresh()
    registry, plugin = exporter_registry(lambda: refresher.latest)
    plugin.record_allocate(SHARED, True, 0.001)
    plugin.record_health_transition(T4, False)
    plugin.record_config_reload(False)
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def all_panels(dashboard: dict[str, object]) -> list[dict[str, object]]:
    panels = dashboard["panels"]
    assert isinstance(panels, list)
    return panels


async def test_dashboard_is_well_formed_and_queries_real_series(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "gpuslice-sharing"
    assert isinstance(dashboard["schemaVersion"], int)
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    series = await exported_series(tmp_path)
    used: set[str] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert isinstance(grid, dict)
        assert grid["x"] + grid["w"] <= 24
        if panel["type"] == "row":
            continue
        targets = panel["targets"]
        assert isinstance(targets, list)
        assert targets, f"panel {panel['title']!r} has no query"
        for target in targets:
            for name in METRIC.findall(target["expr"]):
                assert name in series, f"{panel['title']!r} queries {name}, never exported"
                used.add(name)
            for label in re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")):
                names = METRIC.findall(target["expr"])
                assert any(label in series[n] for n in names), (panel["title"], label)
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"])
            assert match is not None
            assert match.group(2) in series[match.group(1)]
    # Both halves of the "over its share" comparison, and every GPU family, are on it.
    assert {
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_UTIL",
        "gpuslice_pod_memory_used_bytes",
        "gpuslice_pod_entitled_memory_bytes",
        "gpuslice_pod_sm_util_percent",
        "gpuslice_pod_entitled_sm_fraction",
    } <= used
