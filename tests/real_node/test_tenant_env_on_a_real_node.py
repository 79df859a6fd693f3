"""Who wins when a pod sets the hook's variables itself: measured on the real kubelet and
containerd (issue 40, item 4).

The agent serves time-sliced replicas of a simulated A100 whose driver has the limits calls
(r615), on a node it sees as cgroup v2 (`--cgroup-root` is a temp tree with
`cgroup.controllers`: the hook's variables depend only on what the agent detects), with the
`cdi-annotations` strategy: so Allocate gives each container `NVIDIA_GPU_MEMORY_REQUEST` and
`NVIDIA_GPU_MEMORY_LIMIT` (its share). The CDI spec behind the devices' names stands in for
the toolkit's (v1.20.1+): per GPU, the `apply-cuda-memory-limits` hook at `createRuntime` (a
stand-in program recording the environment of the OCI spec it is given, which is what the
real hook reads, taking the first occurrence) and one env edit. One pod sets none of these;
one sets them all in its spec. Read back: the process's environment (`env`, every entry)
and what the hook saw.

What the kubelet (1.36) and containerd (2.4, CDI on) do, measured here: the kubelet sends
the device plugin's envs first and the pod's after them in the CRI `ContainerConfig`, and
containerd keeps both in the OCI spec (it replaces an image's variable, not a repeated one
of the CRI list), in that order; runc gives the process the last. A CDI edit then replaces
the pod's value in place. So:

* device-plugin mode: the OCI spec holds Allocate's pair first, and the toolkit's hook, which
  takes the first occurrence, applies gpuslice's share even when the pod sets its own; the
  process only *sees* its own value. A tenant's own variables reach the hook only where
  Allocate sets none (a GPU the agent finds not capable, GPUs needing different limits):
  the agent's read-back then finds the limit above the share (`caps-limit-raised`) and sets
  the share again, the guard watching the container until it is confirmed;
* DRA mode: the claim's CDI spec carries the pair, and its edit replaces the pod's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuslice.backends import open_backend
from gpuslice.testing import realnode
from gpuslice.testing.realnode import AgentProcess, RealNode

pytestmark = pytest.mark.timeout(180)

NAMESPACE = "tenants"
HOOK_ENV = ("NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_REQUEST")
SHARE = str(40960 // 4)
"""An A100 40GB's MiB over 4 replicas."""
CONFIG = """\
version: v1
flags:
  plugin:
    deviceListStrategy: cdi-annotations
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
PROBE = "GPUSLICE_TEST_CDI_PROBE"
"""Set by the CDI spec's env edit and by the tenant's pod: which one the container holds."""
STAND_IN = """#!{python}
# Stand-in for nvidia-cdi-hook: records the OCI spec's environment it would read, exits 0.
import json, os, sys, time
state = json.load(sys.stdin)
config = json.load(open(os.path.join(state["bundle"], "config.json")))
out = os.path.join({record!r}, "%d.json" % time.time_ns())
json.dump(config.get("process", {{}}).get("env", []), open(out, "w"))
"""
PRINT_ENV = "env | grep -e ^NVIDIA_GPU_MEMORY_ -e ^GPUSLICE_; echo up; exec sleep 3600"


@dataclass
class Agent(AgentProcess):
    records: Path


def _toolkit_spec(work: Path, node: RealNode, node_file: Path) -> Path:
    """The spec the toolkit generates for the device plugin's names, reduced to what this
    test reads: per GPU, the memory limits hook (a stand-in) and one env edit."""
    records = work / "hook-records"
    records.mkdir()
    hook = work / "nvidia-cdi-hook"
    hook.write_text(STAND_IN.format(python=sys.executable, record=str(records)), "utf-8")
    hook.chmod(0o755)
    backend = open_backend(str(node_file))
    try:
        uuids = [g.uuid for g in backend.inventory().gpus]
    finally:
        backend.close()
    devices = [
        {
            "name": uuid,
            "containerEdits": {
                "env": [f"{PROBE}=cdi"],
                "hooks": [
                    {
                        "hookName": "createRuntime",
                        "path": str(hook),
                        "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--gpu-id", uuid],
                    }
                ],
            },
        }
        for uuid in uuids
    ]
    spec = {"cdiVersion": "0.6.0", "kind": "k8s.device-plugin.nvidia.com/gpu", "devices": devices}
    node.cdi_dir.mkdir(parents=True, exist_ok=True)
    (node.cdi_dir / "k8s.device-plugin.nvidia.com-gpu.json").write_text(json.dumps(spec), "utf-8")
    return records


@pytest.fixture(scope="module")
def agent(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    work = tmp_path_factory.mktemp("tenant-env")
    cgroups = work / "cgroup"
    cgroups.mkdir()
    (cgroups / "cgroup.controllers").write_text("cpu memory pids\n", encoding="utf-8")
    (cgroups / "kubepods.slice").mkdir()  # the host's tree: the kubelet's pods are there
    (work / "node.yaml").write_text(
        'driverVersion: "615.20"\ngpus:\n  - model: a100-40gb\n    count: 2\n', encoding="utf-8"
    )
    (work / "config.yaml").write_text(CONFIG, encoding="utf-8")
    records = _toolkit_spec(work, real_node, work / "node.yaml")
    real_node.ensure_namespace(NAMESPACE)
    args = [
        "--node", str(work / "node.yaml"),
        "--config-file", str(work / "config.yaml"),
        "--node-name", real_node.name,
        "--kubeconfig", str(real_node.plane.kubeconfig),
        "--no-labels",
        "--pod-resources-socket", str(real_node.pod_resources_socket),
        "--cgroup-root", str(cgroups),
        "--memory-caps", "auto",
        "--memory-guard", "off",
        "--no-compute-mode",
    ]  # fmt: skip
    started = AgentProcess.start(real_node, args, work / "plugin.log")
    running = Agent(started.node, started.proc, started.log_path, records)
    try:
        running.wait(lambda: real_node.allocatable("nvidia.com/gpu") == "8", "allocatable 8")
        yield running
    finally:
        running.stop(NAMESPACE)
        (real_node.cdi_dir / "k8s.device-plugin.nvidia.com-gpu.json").unlink(missing_ok=True)


Seen = dict[str, list[str]]
"""Each variable of ours -> its values, in the order they occur."""


def _values(lines: list[str]) -> Seen:
    out: Seen = {}
    for line in lines:
        key, _, value = line.partition("=")
        if key.startswith("NVIDIA_GPU_MEMORY_") or key == PROBE:
            out.setdefault(key, []).append(value)
    return out


def _run(agent: Agent, name: str, env: dict[str, str]) -> tuple[Seen, Seen]:
    """(the variables as the process sees them, as the hook saw them in the OCI spec)."""
    before = set(agent.records.iterdir())
    manifest = realnode.pod(
        name, NAMESPACE, PRINT_ENV, node=agent.node.name, limits={"nvidia.com/gpu": "1"}
    )
    manifest["spec"]["containers"][0]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    agent.run_pod(manifest, started=lambda log: "up" in log)
    seen = agent.node.container_log(NAMESPACE, name, "main").splitlines()
    agent.wait(lambda: len(set(agent.records.iterdir()) - before) == 1, "the hook's record")
    [record] = set(agent.records.iterdir()) - before  # one GPU, one hook
    oci = json.loads(record.read_text(encoding="utf-8"))
    assert f"GPUSLICE_MEMORY_LIMIT_MIB={SHARE}" in seen
    return _values(seen), _values(oci)


def test_allocates_pair_comes_first_for_the_hook_and_a_cdi_edit_replaces_the_pods(
    agent: Agent,
) -> None:
    try:
        # Allocate's pair reaches the container of a pod that sets none, and the hook
        process, oci = _run(agent, "plain", {})
        want = {**{k: [SHARE] for k in HOOK_ENV}, PROBE: ["cdi"]}
        assert process == oci == want
        # a pod that sets its own: the OCI spec holds both, Allocate's first, so the hook
        # (first occurrence) applies the share; the process sees only the pod's (the
        # runtime keeps the last); the CDI edit replaced the pod's value in place
        process, oci = _run(agent, "tenant", {**dict.fromkeys(HOOK_ENV, "40960"), PROBE: "pod"})
        assert oci == {**{k: [SHARE, "40960"] for k in HOOK_ENV}, PROBE: ["cdi"]}
        assert process == {**{k: ["40960"] for k in HOOK_ENV}, PROBE: ["cdi"]}
    finally:
        for name in ("plain", "tenant"):
            agent.delete_pod(NAMESPACE, name)
