"""The device plugin under the real kubelet: pods that run, on a simulated node of two A100s.

Everything here goes through the kubelet itself: registration, ListAndWatch into the Node's
allocatable, Allocate and GetPreferredAllocation for pods containerd starts, health changes,
the kubelet restarting, the config changed live by the node label, per-pod metrics through
the real containers' cgroups and the kubelet's PodResources, and the memory guard stopping a
real container's process. The tests run in file order on one node and leave it as they
found it.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.backends.simulated.control import ControlDir
from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest, realnode
from gpuslice.testing.realnode import AgentProcess, RealNode, sim_uuids

pytestmark = pytest.mark.timeout(180)

SIM = "sim:2xa100-40gb"
NAMESPACE = "default"
CONFIGS = {
    "ts4": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n",
    "ts2": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n",
}
CONFIG_LABEL = "nvidia.com/device-plugin.config"


@dataclass
class Plugin(AgentProcess):
    control: ControlDir
    metrics_port: int
    uuids: list[str]

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


@pytest.fixture(scope="module")
def plugin(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    work = tmp_path_factory.mktemp("dp")
    configs = work / "configs"
    configs.mkdir()
    for name, text in CONFIGS.items():
        (configs / name).write_text(text, encoding="utf-8")
    real_node.ensure_namespace(NAMESPACE)
    port = envtest.free_port()
    control = ControlDir(work / "control")
    args = [
        "--node", SIM,
        "--config-file", str(configs),
        "--default-config", "ts4",
        "--node-name", real_node.name,
        "--kubeconfig", str(real_node.plane.kubeconfig),
        "--labels-mode", "api",
        "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
        "--metrics-interval", "0.5",
        "--pod-resources-socket", str(real_node.pod_resources_socket),
        "--memory-guard", "enforce", "--memory-guard-interval", "0.2",
        "--memory-guard-grace", "0",
        "--no-compute-mode",
    ]  # fmt: skip
    agent = AgentProcess.start(
        real_node, args, work / "plugin.log", {"GPUSLICE_SIM_CONTROL_DIR": str(control.path)}
    )
    running = Plugin(agent.node, agent.proc, agent.log_path, control, port, sim_uuids(SIM))
    try:
        running.wait(lambda: real_node.allocatable("nvidia.com/gpu") == "8", "allocatable 8")
        yield running
    finally:
        running.stop(NAMESPACE)


def run_pod(plugin: Plugin, name: str, script: str, gpus: int = 1) -> Json:
    manifest = realnode.pod(
        name, NAMESPACE, script, node=plugin.node.name, limits={"nvidia.com/gpu": str(gpus)}
    )
    return plugin.run_pod(manifest, started=bool)


def delete_pod(plugin: Plugin, name: str) -> None:
    plugin.delete_pod(NAMESPACE, name)


def visible_devices(plugin: Plugin, pod: str) -> list[str]:
    text = plugin.node.container_log(NAMESPACE, pod, "main")
    [line] = [ln for ln in text.splitlines() if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return line.split("=", 1)[1].split(",")


PRINT_ENV = "env | grep ^NVIDIA_VISIBLE_DEVICES=; exec sleep 3600"


def test_registered_with_replicas_and_labels(plugin: Plugin) -> None:
    node = plugin.node.node()
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"  # 2 GPUs x 4 replicas
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"].endswith("-SHARED")


def test_a_pod_runs_with_its_gpu_and_replicas_are_balanced(plugin: Plugin) -> None:
    """Allocate sets the environment the container sees; GetPreferredAllocation (the kubelet
    asks it before Allocate) puts the second pod on the GPU the first does not use."""
    run_pod(plugin, "first", PRINT_ENV)
    run_pod(plugin, "second", PRINT_ENV)
    try:
        [first], [second] = visible_devices(plugin, "first"), visible_devices(plugin, "second")
        assert {first, second} == set(plugin.uuids)
        # the kubelet asked, and took the answer: the second pod's replica is one the
        # plugin preferred
        preferred = [ln for ln in plugin.log().splitlines() if "event=preferred" in ln]
        assert preferred, "the kubelet never called GetPreferredAllocation"
        assert second in preferred[-1]
    finally:
        delete_pod(plugin, "first")
        delete_pod(plugin, "second")


def test_an_xid_takes_the_gpus_replicas_out_of_allocatable(plugin: Plugin) -> None:
    node = plugin.node
    plugin.control.send({"kind": "xid", "gpu": 1, "xid": 79})
    plugin.wait(lambda: node.allocatable("nvidia.com/gpu") == "4", "allocatable 4 after XID 79")
    assert node.node()["status"]["capacity"]["nvidia.com/gpu"] == "8"
    plugin.control.send({"kind": "recovered", "gpu": 1})
    plugin.wait(lambda: node.allocatable("nvidia.com/gpu") == "8", "allocatable 8 again")


def test_the_config_label_changes_the_replicas_live(plugin: Plugin) -> None:
    node = plugin.node

    def label(value: str | None) -> None:
        arg = f"{CONFIG_LABEL}-" if value is None else f"{CONFIG_LABEL}={value}"
        done = node.plane.kubectl("label", "node", node.name, "--overwrite", arg)
        assert done.returncode == 0, done.stderr

    label("ts2")
    try:
        plugin.wait(lambda: node.allocatable("nvidia.com/gpu") == "4", "ts2: 2 GPUs x 2")
        assert node.node()["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "2"
    finally:
        label(None)
    plugin.wait(lambda: node.allocatable("nvidia.com/gpu") == "8", "back to the default ts4")


def test_the_plugin_registers_again_when_the_kubelet_restarts(plugin: Plugin) -> None:
    """The kubelet removes every plugin socket at start; a pod admitted afterwards can only
    get a GPU once the plugin has noticed and registered again."""
    node = plugin.node
    registered_before = plugin.log().count("event=registered")
    node.restart_kubelet()
    plugin.wait(
        lambda: plugin.log().count("event=registered") > registered_before, "registered again"
    )
    run_pod(plugin, "after-restart", PRINT_ENV)
    try:
        assert visible_devices(plugin, "after-restart")[0] in plugin.uuids
    finally:
        delete_pod(plugin, "after-restart")


def _host_pid(pod_uid: str) -> int:
    """The host PID of the pod's `sleep` (its container's only process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"pod{pod_uid}/" in cgroup and b"sleep" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no process of pod {pod_uid} found")


def _pod_samples(text: str, name: str) -> dict[str, float]:
    return {
        s.labels["pod"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and "pod" in s.labels
    }


def test_metrics_and_the_memory_guard_on_real_containers(plugin: Plugin) -> None:
    """Three pods, so two share a GPU (balanced placement spreads them 2 + 1). The simulated
    GPU reports memory for the containers' real host PIDs; the agent finds the pods through
    their cgroups and the kubelet's PodResources. One pod on the shared GPU then leaks: the
    guard stops its process and its neighbour keeps running."""
    names = ["pod-a", "pod-b", "pod-c"]
    pods = {n: run_pod(plugin, n, PRINT_ENV) for n in names}
    try:
        gpu_of = {n: visible_devices(plugin, n)[0] for n in names}
        pid_of = {n: _host_pid(pods[n]["metadata"]["uid"]) for n in names}
        shared = [n for n in names if list(gpu_of.values()).count(gpu_of[n]) == 2]
        assert len(shared) == 2, gpu_of
        leaker, neighbour = shared
        index = plugin.uuids.index(gpu_of[leaker])
        plugin.control.add_process(pid_of[neighbour], index, used_memory_mib=8000)
        plugin.control.add_process(pid_of[leaker], index, used_memory_mib=4000)

        def attributed() -> bool:
            used = _pod_samples(plugin.scrape(), "gpuslice_pod_memory_used_bytes")
            return used.get(neighbour) == 8000 * 2**20 and used.get(leaker) == 4000 * 2**20

        plugin.wait(attributed, "memory attributed to the pods")
        # 40960 MiB, four replicas: 10240 MiB each; the leaker grows past it until free
        # memory runs below the 10 % reserve, and the guard stops it
        plugin.control.grow_process(pid_of[leaker], index, start_mib=4000, rate_mib_s=4000)

        def phase(name: str) -> str:
            got = plugin.node.plane.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json")
            return str(json.loads(got.stdout)["status"].get("phase"))

        def stopped() -> bool:
            return not Path(f"/proc/{pid_of[leaker]}").exists()

        plugin.wait(stopped, "the leaker's process stopped")
        plugin.control.remove_process(pid_of[leaker])
        plugin.wait(lambda: phase(leaker) in ("Failed", "Succeeded"), "the leaker's pod ended")
        assert Path(f"/proc/{pid_of[neighbour]}").exists()
        assert phase(neighbour) == "Running"
        assert (
            "GPUMemoryReclaimed"
            in plugin.node.plane.kubectl("get", "events", "-n", NAMESPACE).stdout
        )
    finally:
        for n in names:
            delete_pod(plugin, n)
