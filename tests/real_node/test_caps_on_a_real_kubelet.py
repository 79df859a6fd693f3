"""Memory caps under the real kubelet and containerd (issue 32), on a simulated NVML of
driver branch r615 (which has the limits calls):

* DRA: a claim shared by pods (GuardConfig `sharedBy: 4`) is prepared with a CDI spec that
  runs the toolkit's `apply-cuda-memory-limits` hook; containerd runs it at `createRuntime`,
  and a stand-in program at the hook's path records its arguments, the OCI state it reads
  on stdin and the environment of the container's OCI spec (the bundle's `config.json`),
  held against the toolkit's contract: `--driver-root`, one `--gpu-id` per GPU,
  `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` in whole MiB, request <= limit, a
  state with the container's pid and bundle;
* the same node detected as unable (a driver before r615) gets no hook, and the pod runs;
* device-plugin mode: the agent applies the limits to the real container's cgroup (on the
  simulated NVML) as soon as the pod watch shows the container, and reads them back: the
  metrics show them, and the cgroup it names is the container's.

The tests skip where this machine cannot run a real node (see conftest.py), and say so
where the node runs cgroup v1 (then the agent must refuse caps, which is checked).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest, realnode
from gpuslice.testing.realnode import AgentProcess, RealNode

pytestmark = pytest.mark.timeout(240)

DRIVER = "gpu.nvidia.com"
NAMESPACE = "caps"
MIB = 1024 * 1024
H100_MIB = 81559
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression":
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    }}]},
}  # fmt: skip
CGROUP_V2 = Path("/sys/fs/cgroup/cgroup.controllers").is_file()

STAND_IN = """#!{python}
# Stand-in for nvidia-cdi-hook: records what the runtime gave it, exits 0.
import json, os, sys, time
state = json.load(sys.stdin)
config = json.load(open(os.path.join(state["bundle"], "config.json")))
out = os.path.join({record!r}, "%d-%d.json" % (os.getpid(), time.time_ns()))
json.dump({{"argv": sys.argv, "state": state,
           "env": config.get("process", {{}}).get("env", []),
           "cgroupsPath": config.get("linux", {{}}).get("cgroupsPath")}}, open(out, "w"))
"""


def node_file(path: Path, driver: str) -> Path:
    path.write_text(
        f'driverVersion: "{driver}"\ngpus:\n  - model: h100-80gb\n    count: 2\n',
        encoding="utf-8",
    )
    return path


@dataclass
class DraAgent(AgentProcess):
    records: Path


def start_dra(real_node: RealNode, work: Path, driver: str) -> DraAgent:
    driver_root = work / "driver-root"
    dev = driver_root / "dev"
    dev.mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
    records = work / "records"
    records.mkdir()
    hook = work / "bin" / "nvidia-cdi-hook"
    hook.parent.mkdir()
    hook.write_text(STAND_IN.format(python=sys.executable, record=str(records)))
    hook.chmod(0o755)
    agent = AgentProcess.start_dra(
        real_node,
        work,
        sim=str(node_file(work / "node.yaml", driver)),
        driver=DRIVER,
        driver_root=driver_root,
        extra=("--memory-caps", "auto", "--memory-caps-hook-path", str(hook)),
    )
    running = DraAgent(agent.node, agent.proc, agent.log_path, records)
    running.wait(
        lambda: running.log_path.read_text().count("event=dra-registered") >= 1,
        "the kubelet registered the driver",
    )
    return running


def shared_claim(name: str) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.gpuslice.io/v1alpha1", "kind": "GuardConfig",
                "sharedBy": 4}}}],
        }},
    }  # fmt: skip


def run_claim_pod(agent: AgentProcess, name: str) -> None:
    agent.node.create(shared_claim(name))
    manifest = realnode.pod(name, NAMESPACE, "echo up; exec sleep 3600", claims={"gpu": name})
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": agent.node.name}
    agent.run_pod(manifest, started=lambda log: "up" in log)


def release(agent: AgentProcess, name: str) -> None:
    agent.delete_pod(NAMESPACE, name)
    kubectl = agent.node.plane.kubectl
    kubectl("patch", "resourceclaim", name, "-n", NAMESPACE, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
    kubectl("delete", "resourceclaim", name, "-n", NAMESPACE, "--wait=false")


@pytest.fixture(scope="module")
def plane_ready(real_node: RealNode) -> RealNode:
    real_node.ensure_namespace(NAMESPACE)
    real_node.create(GPU_CLASS)
    return real_node


def test_containerd_runs_the_hook_with_the_toolkits_contract(
    plane_ready: RealNode, tmp_path: Path
) -> None:
    if not CGROUP_V2:
        pytest.skip("this node runs cgroup v1: the agent writes no hook (checked below)")
    agent = start_dra(plane_ready, tmp_path, "615.20")
    try:
        run_claim_pod(agent, "capped")
        records = [json.loads(p.read_text()) for p in agent.records.glob("*.json")]
        assert len(records) == 1, records
        [rec] = records
        argv = rec["argv"]
        assert argv[1] == "apply-cuda-memory-limits"
        assert argv[2:4] == ["--driver-root", str(tmp_path / "driver-root")]
        assert argv[4] == "--gpu-id"
        assert argv[5].startswith("GPU-")
        assert len(argv) == 6
        env = dict(e.split("=", 1) for e in rec["env"])
        request = int(env["NVIDIA_GPU_MEMORY_REQUEST"])
        limit = int(env["NVIDIA_GPU_MEMORY_LIMIT"])
        assert request == H100_MIB // 4  # the claim's part of the GPU, whole MiB
        assert request <= limit
        assert limit == request  # strict, the default policy
        assert rec["state"]["pid"] > 0  # createRuntime: the container's process exists
        assert rec["state"]["bundle"]
    finally:
        release(agent, "capped")
        agent.stop(NAMESPACE)


def test_a_node_detected_unable_gets_no_hook_and_the_pod_runs(
    plane_ready: RealNode, tmp_path: Path
) -> None:
    driver = "615.20" if not CGROUP_V2 else "580.95.05"  # cgroup v1, or a driver before r615
    agent = start_dra(plane_ready, tmp_path, driver)
    try:
        run_claim_pod(agent, "uncapped")
        assert list(agent.records.glob("*.json")) == []
        specs = list(plane_ready.cdi_dir.glob("k8s.gpuslice.io-claim_*"))
        assert specs
        assert all("apply-cuda-memory-limits" not in p.read_text() for p in specs)
        assert "event=caps-unavailable" in agent.log_path.read_text()
    finally:
        release(agent, "uncapped")
        agent.stop(NAMESPACE)


def test_device_plugin_mode_the_agent_caps_the_real_containers_cgroup(
    plane_ready: RealNode, tmp_path: Path
) -> None:
    config = tmp_path / "ts4.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n",
        encoding="utf-8",
    )
    port = envtest.free_port()
    args = [
        "--node", str(node_file(tmp_path / "node.yaml", "615.20")),
        "--config-file", str(config),
        "--node-name", plane_ready.name,
        "--kubeconfig", str(plane_ready.plane.kubeconfig),
        "--labels-mode", "api",
        "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
        "--metrics-interval", "0.5",
        "--pod-resources-socket", str(plane_ready.pod_resources_socket),
        "--memory-guard", "observe", "--memory-guard-interval", "0.2",
        "--memory-caps", "auto",
        "--no-compute-mode",
    ]  # fmt: skip
    agent = AgentProcess.start(plane_ready, args, tmp_path / "plugin.log")
    try:
        agent.wait(lambda: plane_ready.allocatable("nvidia.com/gpu") == "8", "allocatable 8")
        manifest = realnode.pod(
            "dp", NAMESPACE, "echo up; exec sleep 3600",
            node=plane_ready.name, limits={"nvidia.com/gpu": "1"},
        )  # fmt: skip
        agent.run_pod(manifest, started=lambda log: "up" in log)
        if not CGROUP_V2:
            agent.wait(lambda: "refusal=cgroup-v1" in agent.log_path.read_text(), "refused")
            return
        agent.wait(lambda: "event=caps-applied" in agent.log_path.read_text(), "caps applied")
        [line] = [ln for ln in agent.log_path.read_text().splitlines() if "caps-applied" in ln]
        cgroup = line.split("cgroup=", 1)[1].split()[0]
        assert Path(cgroup).is_dir()  # the real container's cgroup
        assert cgroup.startswith("/sys/fs/cgroup/")

        def soft() -> float | None:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if (
                        s.name == "gpuslice_pod_memory_soft_limit_bytes"
                        and s.labels.get("pod") == "dp"
                    ):
                        return float(s.value)
            return None

        agent.wait(lambda: soft() is not None, "the limits read back in the metrics")
        assert soft() == H100_MIB // 4 * MIB
    finally:
        agent.stop(NAMESPACE)
