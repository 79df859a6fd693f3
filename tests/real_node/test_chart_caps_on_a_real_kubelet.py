"""The chart's memory caps on a real kubelet and containerd (issue 40 item 1): `helm install`
with `memoryCaps.mode=auto`, the agent's pod run by the real kubelet with the host's cgroup
tree mounted at its own path, CAP_SYS_ADMIN and the PodResources socket, on a simulated
NVML of driver branch r615 (which has the limits calls).

* Everywhere a real node runs: the pod starts and turns Ready under those mounts and that
  capability, and the agent reports what the node allows (on cgroup v1: not capped, the
  reason the node's cgroup version).
* On a cgroup v2 node only: the agent, in its own cgroup namespace, finds a workload pod's
  cgroup on the host's tree through the mount and caps it; the cgroup it names is the
  host's path of the workload's container. This machine's CI node runs cgroup v1 (the
  driver keys limits by a cgroup v2 path, and NVIDIA's hook fails the container there), so
  that test skips here, saying so.

Shares the deployment of tests/real_node/test_chart_on_a_real_kubelet.py (its image, its
release name); each module installs and uninstalls its own release.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.core.jsontypes import Json
from tests.real_node.test_chart_on_a_real_kubelet import (
    CONFIG_NAME,
    Deployment,
    _agent_process,
    _status_fields,
    deployment,  # noqa: F401 - the module's fixture, shared
    sharing,
    wait_for,
)

pytestmark = pytest.mark.timeout(900)

CGROUP_V2 = Path("/sys/fs/cgroup/cgroup.controllers").is_file()
CAP_SYS_ADMIN = 21
NODE_FILE = 'driverVersion: "615.20"\ngpus:\n  - model: a100-40gb\n    count: 2\n'


def _caps_values(deployed: Deployment) -> Json:
    """The release's values with caps on, the simulated node read from a file the agent
    sees: the MPS root is a host directory mounted at its own path."""
    (deployed.work / "mps").mkdir(exist_ok=True)
    node_file = deployed.work / "mps" / "node.yaml"
    node_file.write_text(NODE_FILE, encoding="utf-8")
    values = deployed.values(memoryCaps={"mode": "auto"})
    values["config"] = {"map": {CONFIG_NAME: sharing(4)}, "default": CONFIG_NAME}
    values["extraEnv"] = [
        {"name": "GPUSLICE_NODE", "value": str(node_file)} if e["name"] == "GPUSLICE_NODE" else e
        for e in values["extraEnv"]
    ]
    return values


def _get(deployed: Deployment, path: str) -> str:
    url = f"http://127.0.0.1:{deployed.metrics_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _status(deployed: Deployment) -> Json:
    doc: Json = json.loads(_get(deployed, "/status"))
    return doc


def _protection(deployed: Deployment) -> list[tuple[str, str]]:
    return [
        (s.labels["protection"], s.labels["reason"])
        for fam in text_string_to_metric_families(_get(deployed, "/metrics"))
        for s in fam.samples
        if s.name == "gpuslice_gpu_memory_protection"
    ]


def test_the_charts_caps_pod_runs_with_the_hosts_cgroup_tree_and_cap_sys_admin(
    deployment: Deployment,  # noqa: F811
) -> None:
    deployment.install(_caps_values(deployment), "helm install (memory caps)")
    pod = deployment.agent_pod()
    [container] = pod["status"]["containerStatuses"]
    assert container["restartCount"] == 0, deployment.agent_log(pod)
    pid = _agent_process()
    effective = int(_status_fields(pid)["CapEff"], 16)
    assert effective == 1 << CAP_SYS_ADMIN  # that one capability, nothing else
    mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    *_, cgroup = [ln.split() for ln in mounts if ln.split()[4] == "/sys/fs/cgroup"]
    assert "ro" in cgroup[5].split(",")  # the topmost mount there: the chart's, read-only
    wait_for(lambda: len(_protection(deployment)) == 2, "each GPU's protection reported")
    if not CGROUP_V2:
        assert set(_protection(deployment)) == {
            ("none", "the node runs cgroup v1; memory limits need cgroup v2")
        }


def test_the_charts_agent_caps_a_workload_on_the_hosts_cgroup_tree(
    deployment: Deployment,  # noqa: F811
) -> None:
    if not CGROUP_V2:
        pytest.skip(
            "this node runs cgroup v1: memory caps need cgroup v2 (NVML keys the limits by a "
            "cgroup v2 path; NVIDIA's hook fails the container on v1); runs on a cgroup v2 "
            "node with the real-node tier"
        )
    deployment.workload("capped", {"nvidia.com/gpu": "1"})
    uid = deployment.pod("chart-workloads", "capped")["metadata"]["uid"]

    def soft_limit() -> float | None:
        for fam in text_string_to_metric_families(_get(deployment, "/metrics")):
            for s in fam.samples:
                if s.name == "gpuslice_pod_memory_soft_limit_bytes" and s.labels["pod"] == "capped":
                    return float(s.value)
        return None

    wait_for(
        lambda: soft_limit() is not None, "the workload's limits read back", deployment.diagnose
    )
    [gpu] = [g for g in _status(deployment)["gpus"] if g["memory_protection"] == "capped"]
    assert soft_limit() == gpu["memory_total_mib"] * 1024 * 1024 // 4
    [line] = [ln for ln in deployment.agent_log().splitlines() if "event=caps-applied" in ln]
    cgroup = line.split("cgroup=", 1)[1].split()[0]
    assert cgroup.startswith("/sys/fs/cgroup/kubepods")  # the host's tree, as the hook names it
    assert uid.replace("-", "_") in cgroup or uid in cgroup
    assert Path(cgroup).is_dir()  # the workload's own cgroup, seen from the host
    deployment.delete_workloads()
    deployment.uninstall()
