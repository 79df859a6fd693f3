"""The Helm chart through scripts/check-chart: real helm lint and render, schema-validated."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip(
    "helm_sdkpy",
    reason="helm-sdkpy not installed: pip install --ignore-requires-python "
    "-r scripts/requirements-chart.txt",
)
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-chart"


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("check_chart", str(SCRIPT))
    spec = importlib.util.spec_from_loader("check_chart", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_chart"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


check_chart = _load()
SETS: dict[str, dict[str, Any]] = check_chart.values_sets()


def render(name: str = "default", **overrides: Any) -> Any:
    values = check_chart.deep_merge(SETS[name], overrides)
    return check_chart.check_values(name, values)


def one(result: Any, kind: str) -> dict[str, Any]:
    [obj] = [m for m in result.manifests if m["kind"] == kind]
    return dict(obj)


def env_of(daemonset: dict[str, Any]) -> dict[str, Any]:
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_documented_values_set_passes(name: str) -> None:
    result = check_chart.check_values(name, SETS[name])
    assert result.ok, result.problems
    assert any(m["kind"] == "DaemonSet" for m in result.manifests)


def test_daemonset_runs_on_gpu_nodes_like_nvidias() -> None:
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]}
    assert "feature.node.kubernetes.io/pci-10de.present" in keys
    assert pod["hostPID"] is False  # least privilege: only asked-for features get it
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {
        "/var/lib/kubelet/device-plugins",
        "/etc/kubernetes/node-feature-discovery/features.d",
        "/var/lib/kubelet/pod-resources",
        "/run/nvidia/mps",
    } <= paths
    env = env_of(one(render(), "DaemonSet"))
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config"
    assert env["FALLBACK_STRATEGIES"] == "named,single"
    assert env["MPS_ROOT"] == "/run/nvidia/mps"
    assert env["METRICS_PORT"] == "9400"
    assert "CONFIG_FILE" not in env  # no named configs: NVIDIA's defaults


def test_named_configs_become_a_configmap_mounted_for_the_agent() -> None:
    result = render("per-node-configs")
    data = one(result, "ConfigMap")["data"]
    seed = SETS["per-node-configs"]["config"]["map"]
    assert data == {k: v or "" for k, v in seed.items()}
    assert data["default"] == ""
    env = env_of(one(result, "DaemonSet"))
    assert env["CONFIG_FILE"] == "/available-configs"
    assert env["DEFAULT_CONFIG"] == "default"


def test_rbac_reads_nodes_and_patches_only_in_api_mode() -> None:
    def node_verbs(result: Any) -> set[str]:
        rules = one(result, "ClusterRole")["rules"]
        return {v for r in rules if "nodes" in r["resources"] for v in r["verbs"]}

    assert node_verbs(render()) == {"get", "list", "watch"}
    assert node_verbs(render(labels={"mode": "api"})) == {"get", "list", "watch", "patch"}
    rules = one(render(), "ClusterRole")["rules"]
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]} in rules


def test_pods_are_readable_only_when_metrics_attribute_them() -> None:
    """Per-pod attribution maps pod UIDs through the API; without metrics, no pod access."""
    pods_rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    assert pods_rule in one(render(), "ClusterRole")["rules"]
    off = one(render(metrics={"enabled": False}), "ClusterRole")["rules"]
    assert not [r for r in off if "pods" in r.get("resources", [])]


def test_host_pid_for_attribution_or_mps() -> None:
    def host_pid(**values: Any) -> bool:
        return bool(one(render(**values), "DaemonSet")["spec"]["template"]["spec"]["hostPID"])

    assert not host_pid(), "nothing asks for it by default"
    assert host_pid(metrics={"enabled": False}, mps={"enabled": True}), "the MPS daemon needs it"
    assert not host_pid(metrics={"enabled": False}, mps={"enabled": True, "enableHostPID": False})
    assert not host_pid(mps={"enableHostPID": True}), "MPS off: its host PID ask is moot"
    assert host_pid(metrics={"hostPID": True}), "per-pod attribution needs it"
    assert not host_pid(metrics={"enabled": False, "hostPID": True})


def test_service_monitor_only_when_asked() -> None:
    assert not [m for m in render().manifests if m["kind"] == "ServiceMonitor"]
    result = render("mig-mixed-monitoring")
    assert one(result, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"
    assert one(result, "DaemonSet")["spec"]["template"]["spec"]["hostPID"] is False


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"config": {"name": "mine", "map": {"a": ""}}}, "config.name and config.map"),
        (
            {"config": {"map": {"a": "", "b": ""}, "default": ""}},
            "unlabelled nodes would have no config",
        ),
        ({"config": {"map": {"a": ""}, "default": "b"}}, "config.default=b is not a key"),
        ({"labels": {"mode": "nfd"}}, "labels.mode=nfd"),
        ({"config": {"fallbackStrategies": ["named", "first"]}}, "unknown fallback strategy"),
    ],
)
def test_chart_validation_rejects_bad_values(overrides: dict[str, Any], expected: str) -> None:
    result = render(**overrides)
    assert not result.ok
    assert any(expected in p for p in result.problems), result.problems


def test_schema_validation_catches_bad_manifests() -> None:
    result = render(updateStrategy={"type": "RollingUpdate", "rollingUpdates": {}})
    assert not result.ok
    assert any("DaemonSet" in p and "rollingUpdates" in p for p in result.problems)
