"""The Helm chart through scripts/check-chart: real helm lint and render, schema-validated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import SETS, check_chart, container_of, env_of, one, render


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

    # its own Node by name: listed from the watch cache, then watched; never patched
    # outside api mode
    assert node_verbs(render()) == {"get", "list", "watch"}
    assert node_verbs(render(labels={"mode": "api"})) == {"get", "list", "watch", "patch"}
    rules = one(render(), "ClusterRole")["rules"]
    assert not [r for r in rules if "events" in r["resources"]], "events: a Role (privilege tests)"


def test_pods_are_readable_only_when_metrics_or_the_guard_attribute_them() -> None:
    """Per-pod attribution maps pod UIDs through the API; without metrics and memory guard,
    no pod access."""
    pods_rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
    assert pods_rule in one(render(), "ClusterRole")["rules"]
    guard_only = one(render(metrics={"enabled": False}), "ClusterRole")["rules"]
    assert pods_rule in guard_only
    off = one(render(metrics={"enabled": False}, memoryGuard={"mode": "off"}), "ClusterRole")[
        "rules"
    ]
    assert not [r for r in off if any(x.startswith("pods") for x in r.get("resources", []))]


def test_memory_guard_values_reach_the_daemon_and_evict_gets_its_rbac() -> None:
    result = render(memoryGuard={"mode": "enforce", "reserve": "4Gi", "action": "evict"})
    container = one(result, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MEMORY_GUARD"] == "enforce"
    assert env["MEMORY_GUARD_RESERVE"] == "4Gi"
    assert env["MEMORY_GUARD_ACTION"] == "evict"
    assert env["MEMORY_SOFT_LIMITS"] == "true"
    assert "POD_UID" in env, "the guard never signals its own pod"
    evict = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
    assert evict in one(result, "ClusterRole")["rules"]
    assert evict not in one(render(), "ClusterRole")["rules"]


def test_host_pid_for_attribution_or_mps() -> None:
    def host_pid(**values: Any) -> bool:
        return bool(one(render(**values), "DaemonSet")["spec"]["template"]["spec"]["hostPID"])

    assert not host_pid(), "nothing asks for it by default"
    assert host_pid(metrics={"enabled": False}, mps={"enabled": True}), "the MPS daemon needs it"
    assert not host_pid(metrics={"enabled": False}, mps={"enabled": True, "enableHostPID": False})
    assert not host_pid(mps={"enableHostPID": True}), "MPS off: its host PID ask is moot"
    assert host_pid(metrics={"hostPID": True}), "per-pod attribution needs it"
    assert host_pid(metrics={"enabled": False, "hostPID": True}), "the guard's attribution"
    assert not host_pid(metrics={"enabled": False, "hostPID": True}, memoryGuard={"mode": "off"})
    assert host_pid(memoryGuard={"mode": "enforce"}), "an enforcing guard signals host PIDs"


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
        ({"labels": {"mode": "nfd"}}, "labels.mode: 'nfd' is not one of"),
        (
            {"config": {"fallbackStrategies": ["named", "first"]}},
            "config.fallbackStrategies.1: 'first' is not one of",
        ),
    ],
)
def test_chart_validation_rejects_bad_values(overrides: Json, expected: str) -> None:
    result = render(**overrides)
    assert not result.ok
    assert any(expected in p for p in result.problems), result.problems


def test_schema_validation_catches_bad_manifests() -> None:
    result = render(updateStrategy={"type": "RollingUpdate", "rollingUpdates": {}})
    assert not result.ok
    assert any("DaemonSet" in p and "rollingUpdates" in p for p in result.problems)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"lables": {"mode": "api"}}, "'lables' was unexpected"),
        ({"metrics": {"enable": True}}, "'enable' was unexpected"),
        ({"labels": {"mode": "apis"}}, "labels.mode: 'apis' is not one of"),
        ({"probes": {"liveness": {"periodSecond": 3}}}, "'periodSecond' was unexpected"),
        # NVIDIA's DRA chart keeps its GPU and ComputeDomain switches under `resources`
        ({"resources": {"gpus": {"enabled": True}}}, "'gpus' was unexpected"),
    ],
)
def test_a_typo_is_refused_by_the_schema_and_by_helm(overrides: Json, named: str) -> None:
    result = render(**overrides)
    assert not result.ok
    assert any(named in p for p in result.problems), result.problems
    assert "helm lint error in values.yaml" in result.problems, "real Helm refuses it too"


@pytest.mark.parametrize(
    ("overrides", "instead"),
    [
        ({"compatWithCPUManager": True}, "deviceListStrategy"),
        ({"gfd": {"enabled": True}}, "labels.mode"),
        ({"nfd": {"enabled": False}}, "labels.mode=api"),
        ({"devicePlugin": {"enabled": True}}, "remove devicePlugin"),
    ],
)
def test_an_nvidia_only_value_is_refused_with_what_to_use_instead(
    overrides: Json, instead: str
) -> None:
    result = render(**overrides)
    assert not result.ok
    [key] = overrides
    message = f"chart validation: {key} is a value of NVIDIA's chart"
    assert any(p.startswith(message) and instead in p for p in result.problems), result.problems


def test_probes_use_their_own_listener_even_without_gpu_metrics() -> None:
    """The kubelet's probes meet the probe listener (HEALTH_PORT), never the scrape port's
    clients; the metrics port stays for Prometheus."""
    for metrics_enabled in (True, False):
        result = render(metrics={"enabled": metrics_enabled})
        assert result.ok, result.problems
        container = container_of(result)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"metrics": 9400, "health": 9401}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["METRICS_PORT"], env["HEALTH_PORT"]) == ("9400", "9401")
        assert env["GPU_METRICS"] == str(metrics_enabled).lower()


def test_the_network_policy_admits_only_the_scrapers_and_the_probe_cidrs() -> None:
    assert not [m for m in render().manifests if m["kind"] == "NetworkPolicy"], "off by default"
    result = render(
        metrics={
            "networkPolicy": {
                "enabled": True,
                "scrapeNamespaces": ["monitoring", "observability"],
                "probeCIDRs": ["10.0.0.0/16"],
            }
        },
        probes={"port": 9555},
    )
    assert result.ok, result.problems
    policy = one(result, "NetworkPolicy")
    pod_labels = one(result, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items(), "it selects the agent's pods"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    scrape, probes = policy["spec"]["ingress"]
    [namespaces] = scrape["from"]
    assert namespaces["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": ["monitoring", "observability"],
        }
    ]
    assert scrape["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert probes == {
        "from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}],
        "ports": [{"port": "health", "protocol": "TCP"}],
    }
    ports = {p["name"]: p["containerPort"] for p in container_of(result)["ports"]}
    assert ports["health"] == 9555


def test_a_policy_without_probe_cidrs_leaves_the_probe_port_to_the_cni() -> None:
    result = render(metrics={"networkPolicy": {"enabled": True}})
    assert result.ok, result.problems
    [scrape] = one(result, "NetworkPolicy")["spec"]["ingress"]
    assert scrape["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_default_resources_and_json_logs_value() -> None:
    container = container_of(render())
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "96Mi"}
    assert "cpu" not in container["resources"]["limits"], "a CPU limit throttles Allocate"
    env = {e["name"]: e.get("value") for e in container_of(render(logFormat="json"))["env"]}
    assert env["LOG_FORMAT"] == "json"


def test_the_plugin_runs_as_root_although_the_image_does_not() -> None:
    """The image's USER is 65532; the kubelet's device-plugin directory is root-owned."""
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert "\nUSER 65532:65532\n" in dockerfile
    assert container_of(render())["securityContext"]["runAsUser"] == 0


def test_host_network_only_when_asked_and_the_pod_resources_dir_follows_the_value() -> None:
    """Both exist for nodes the defaults do not fit: one without a pod network yet (the
    real-kubelet tier's node has no CNI), one whose kubelet has another --root-dir."""
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod
    assert "dnsPolicy" not in pod
    [default_dir] = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert default_dir["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"

    pod = one(
        render(
            hostNetwork=True,
            metrics={"port": 9402},  # 9400 is dcgm-exporter's on the node: refused
            podResourcesDir="/var/lib/k0s/kubelet/pod-resources",
        ),
        "DaemonSet",
    )["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # Services still resolve
    [moved] = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert moved["hostPath"] == {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "Directory"}
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount["mountPath"] == "/var/lib/kubelet/pod-resources"  # where the agent looks
