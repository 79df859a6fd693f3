"""docs/migrating-from-nvidia.md's "Order of steps", followed as written on a real kubelet
(issue 43, "Done when": the guide, followed verbatim on the real API server and kubelet tier,
leaves a node sharing its GPUs).

What the guide says is read from the guide, not retyped: its `values.yaml` (the ```yaml block
under "Order of steps") and its commands (the inline `helm ...`/`kubectl ...` of the steps,
as tests/docs/test_docs_commands.py finds them). The commands run in order with bash, as
pasted, `<node>` filled in with the real node's name: `helm` is the docs' shim (real Helm,
helm-sdkpy, with the CLI's flag parsing; it makes `--create-namespace`'s namespace with
kubectl, as this API server cannot serve Helm the OpenAPI document it validates a namespace
against: tests/docs/helm_shim.py), `kubectl` is the real one, both on the real API server
the kubelet of tests/real_node registers with.

What the test node differs in from a cluster is added to `values.yaml` after the guide's keys
(none of which it touches), as tests/real_node/test_chart_on_a_real_kubelet.py sets it: the
image built from this checkout, host networking and free ports (no CNI), the API server's
loopback address (no kube-proxy), the kubelet's temporary root, a simulated node (no GPU),
and `labels.mode: api` (the guide's table: NVIDIA's `gfd.enabled` becomes `labels.mode:
file` with Node Feature Discovery installed, or `api`; this node has no NFD). The node
carries `nvidia.com/gpu.present=true`, as a node that ran NVIDIA's plugin does (the chart's
affinity is NVIDIA's). Step 2's "exclude it from NVIDIA's plugin" has nothing to do here:
no NVIDIA plugin runs on this node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest, realnode
from gpuslice.testing.eventually import eventually_sync
from gpuslice.testing.image import Buildah, default_cache
from gpuslice.testing.realnode import RealNode, sim_uuids
from tests.docs.helm_shim import parse
from tests.docs.test_docs_commands import blocks, migration_values
from tests.real_node.test_chart_on_a_real_kubelet import (
    PRINT_ENV,
    SIM,
    Deployment,
    _export,
    _ready,
    _remove_nvidia_labels,
    complaints,
)

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = "docs/migrating-from-nvidia.md"
WORKLOADS = "migrated-workloads"
WAIT_S = 90.0
COMMAND_TIMEOUT_S = 240


def guide_commands() -> list[str]:
    """The inline commands of the guide's "Order of steps", in the order the steps give them."""
    [steps] = [b for b in blocks() if b.doc == GUIDE and b.number == 0]
    return list(steps.commands)


def guide_replicas() -> int:
    """How many ways the guide's config shares each GPU (its default config's time-slicing)."""
    config = yaml.safe_load(migration_values())["config"]
    name = config.get("default") or "default"
    [resource] = yaml.safe_load(config["map"][name])["sharing"]["timeSlicing"]["resources"]
    assert resource["name"] == "nvidia.com/gpu"
    return int(resource["replicas"])


class Guide:
    """A shell in a scratch directory holding the repository's `deploy` and the guide's
    `values.yaml`, with `helm` (the docs' shim) and `kubectl` on PATH, pointed at the node's
    API server."""

    def __init__(self, node: RealNode, work: Path, tier_values: Json) -> None:
        self.node = node
        self.work = work
        (work / "deploy").symlink_to(ROOT / "deploy")
        guide_values = yaml.safe_load(migration_values())
        overlap = set(guide_values) & set(tier_values)
        assert not overlap, f"the test node's values would change the guide's: {overlap}"
        (work / "values.yaml").write_text(
            migration_values() + "\n# the test node's differences (see the module docstring)\n"
            + yaml.safe_dump(tier_values, sort_keys=False)
        )  # fmt: skip
        bin_dir = work / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "helm"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.docs.helm_shim "$@"\n')
        shim.chmod(0o755)
        (bin_dir / "kubectl").symlink_to(envtest.assets() / "kubectl")
        self.env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        self.env.update(
            KUBECONFIG=str(node.plane.kubeconfig),
            PATH=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
            PYTHONPATH=f"{ROOT}:{ROOT / 'src'}",
            SCRATCH=str(work),  # where the shim marks a release it applied without Helm
        )
        self.transcript: list[str] = []
        self.timings: list[str] = []
        # what step 1 installs, read from it as Helm's CLI reads it (the docs' shim's parser)
        with contextlib.chdir(work):
            verb, positional, self.namespace, _, self.values = parse(
                shlex.split(guide_commands()[0])[1:]
            )
        assert verb == "install", guide_commands()[0]
        self.release = positional[0]
        [self.migrate_label] = self.values["nodeSelector"]

    def daemonset(self) -> Json:
        got = _kubectl_json(self.node, "get", "daemonsets", "-n", self.namespace)
        [daemonset] = got["items"]
        return dict(daemonset)

    def agent_pods(self) -> list[Json]:
        got = _kubectl_json(self.node, "get", "pods", "-n", self.namespace)
        return [p for p in got["items"] if not p["metadata"].get("deletionTimestamp")]

    def pod(self, namespace: str, name: str) -> Json:
        got = self.node.plane.kubectl("get", "pod", name, "-n", namespace, "-o", "json")
        return dict(json.loads(got.stdout)) if got.returncode == 0 else {}

    def diagnose(self) -> str:
        kubectl = self.node.plane.kubectl
        parts = ["\n".join(self.transcript)[-4000:]]
        parts.append(kubectl("get", "pods,ds", "-A", "-o", "wide").stdout)
        parts.append(kubectl("get", "events", "-A").stdout[-3000:])
        for pod in self.agent_pods():
            name = pod["metadata"]["name"]
            parts.append(f"--- {name}: {json.dumps(pod.get('status', {}))[-1500:]}")
            parts.append(self.node.container_log(self.namespace, name, "gpuslice")[-3000:])
        parts.append(f"--- kubelet\n{self.node.kubelet_log()[-3000:]}")
        return "\n".join(parts)

    def run(self, command: str) -> str:
        """`command` as the guide prints it, `<node>` filled in; its output, or the test fails
        naming the step."""
        filled = command.replace("<node>", self.node.name)
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", f"set -e\n{filled}\n"], cwd=self.work, env=self.env,
            capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        took = time.monotonic() - started
        self.transcript.append(f"$ {filled}  ({took:.1f} s)\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, (
            f"the guide's `{filled}` failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout


def _kubectl_json(node: RealNode, *args: str) -> Json:
    got = node.plane.kubectl(*args, "-o", "json")
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


@pytest.fixture
def guide(real_node: RealNode, gpuslice_image: str, tmp_path: Path) -> Iterator[Guide]:
    """The image in the node's containerd, the node as it was under NVIDIA's plugin, and the
    guide's shell; afterwards the workloads, the release, the migration label and the GFD
    labels go, so the node is as the other tests here expect it."""
    repository, _, tag = gpuslice_image.rpartition(":")
    started = time.monotonic()
    archive = tmp_path / "gpuslice.oci.tar"
    _export(Buildah(default_cache() / "storage"), gpuslice_image, archive)
    done = real_node.ctr("images", "import", str(archive))
    assert done.returncode == 0, f"ctr images import: {done.stderr}"
    archive.unlink()
    imported = time.monotonic() - started
    # the test node's values, as test_chart_on_a_real_kubelet sets them, less its config
    deployed = Deployment(real_node, repository, (tag, tag), tmp_path)
    tier = deployed.values()
    del tier["config"]
    work = tmp_path / "work"
    work.mkdir()
    shell = Guide(real_node, work, tier)
    shell.timings.append(f"image export + containerd import: {imported:.1f} s")
    done = real_node.plane.kubectl(
        "label", "node", real_node.name, "--overwrite", "nvidia.com/gpu.present=true"
    )
    assert done.returncode == 0, done.stderr
    real_node.untaint_not_ready()
    real_node.ensure_namespace(WORKLOADS)
    try:
        yield shell
    finally:
        kubectl = real_node.plane.kubectl
        kubectl("delete", "pods", "-n", WORKLOADS, "--all", "--grace-period=0", "--force",
                "--wait=false")  # fmt: skip
        kubectl("label", "node", real_node.name, f"{shell.migrate_label}-")
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            shell.run(f"helm uninstall {shell.release} -n {shell.namespace}")
        with contextlib.suppress(AssertionError):
            eventually_sync(lambda: not shell.agent_pods(), "the agent's pod gone", timeout=60)
        _remove_nvidia_labels(deployed)
        real_node.ctr("images", "rm", gpuslice_image)


def test_the_migration_guide_as_written_leaves_the_node_sharing_its_gpus(
    guide: Guide, report_line: Callable[[str], None]
) -> None:
    """Step 1 installs the chart with the guide's values restricted to no node: the DaemonSet
    is there and places no pod. Step 2's label puts the agent on the node; step 3's commands
    show it Ready and the node offering each GPU as many times as the guide's config shares
    it, with the GFD labels NVIDIA's users select on; a pod asking the scheduler for
    `nvidia.com/gpu: 1` gets one of the node's GPUs. Rolling back (the label removed) takes
    the agent's pod off the node again."""
    node = guide.node
    commands = guide_commands()
    starts = ("helm install ", "kubectl label node <node> ", "kubectl get pod", "kubectl describe")
    assert [c.startswith(s) for c, s in zip(commands, starts, strict=True)] == [True] * 4, commands
    install, label, get_pods, describe = commands
    replicas = guide_replicas()
    gpus = len(sim_uuids(SIM))
    shared = str(gpus * replicas)

    # step 1: installed, restricted to no node yet
    guide.run(install)
    assert guide.values["nodeSelector"] == {guide.migrate_label: "true"}, guide.values

    def seen(daemonset: Json) -> bool:
        observed = daemonset.get("status", {}).get("observedGeneration", 0)
        return bool(observed >= daemonset["metadata"]["generation"])

    eventually_sync(
        lambda: seen(guide.daemonset()),
        "the DaemonSet controller saw the DaemonSet",
        timeout=WAIT_S, interval=0.3, explain=guide.diagnose,
    )  # fmt: skip
    daemonset = guide.daemonset()
    assert daemonset["status"]["desiredNumberScheduled"] == 0, daemonset["status"]
    assert not guide.agent_pods(), "an agent pod before the node was labelled"

    # step 2: the node labelled (no NVIDIA plugin to exclude here)
    guide.run(label)
    labelled = time.monotonic()
    eventually_sync(
        lambda: any(_ready(p) for p in guide.agent_pods()),
        "the agent's pod Ready on the labelled node",
        timeout=WAIT_S, interval=0.3, explain=guide.diagnose,
    )  # fmt: skip
    [pod] = guide.agent_pods()
    guide.timings.append(f"label to agent Ready: {time.monotonic() - labelled:.1f} s")
    assert pod["spec"]["nodeName"] == node.name
    eventually_sync(
        lambda: node.allocatable("nvidia.com/gpu") == shared,
        f"allocatable nvidia.com/gpu {shared} ({gpus} GPUs x {replicas})",
        timeout=WAIT_S, interval=0.3, explain=guide.diagnose,
    )  # fmt: skip
    assert node.node()["status"]["capacity"]["nvidia.com/gpu"] == shared
    guide.timings.append(f"label to {shared} allocatable: {time.monotonic() - labelled:.1f} s")

    # step 3: the guide's checks, as a user reads them
    listed = guide.run(get_pods)
    [row] = [ln for ln in listed.splitlines() if ln.startswith(pod["metadata"]["name"])]
    assert re.search(rf"\s1/1\s+Running\s.*\s{re.escape(node.name)}\s", row), listed
    described = guide.run(describe)
    capacity, allocatable = re.findall(r"^\s+nvidia\.com/gpu:\s+(\S+)$", described, flags=re.M)
    assert capacity == allocatable == shared, described

    # the GFD labels the agent writes (labels.mode: api)
    def labels() -> dict[str, str]:
        return dict(node.node()["metadata"].get("labels") or {})

    eventually_sync(
        lambda: labels().get("nvidia.com/gpu.replicas") == str(replicas),
        f"nvidia.com/gpu.replicas={replicas}",
        timeout=WAIT_S, interval=0.3, explain=guide.diagnose,
    )  # fmt: skip
    got = labels()
    assert got["nvidia.com/gpu.count"] == str(gpus), got
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing", got
    assert got["nvidia.com/gpu.product"].endswith("-SHARED"), got

    # a workload, placed by the scheduler, gets one of the node's GPUs
    workload = realnode.pod("migrated", WORKLOADS, PRINT_ENV, limits={"nvidia.com/gpu": "1"})
    node.create(workload)

    def running() -> bool:
        got = guide.pod(WORKLOADS, "migrated")
        phase = got.get("status", {}).get("phase")
        assert phase not in ("Failed", "Succeeded"), got.get("status")
        log = node.container_log(WORKLOADS, "migrated", "main")
        return phase == "Running" and "NVIDIA_VISIBLE_DEVICES=" in log

    eventually_sync(running, "the workload running with a GPU", timeout=WAIT_S, interval=0.3,
                    explain=guide.diagnose)  # fmt: skip
    assert guide.pod(WORKLOADS, "migrated")["spec"]["nodeName"] == node.name
    log = node.container_log(WORKLOADS, "migrated", "main").splitlines()
    [visible] = [ln.split("=", 1)[1] for ln in log if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible in sim_uuids(SIM), visible
    said = complaints(node.container_log(guide.namespace, pod["metadata"]["name"], "gpuslice"))
    assert not said, "\n".join(said)

    # "Rolling back": the label removed, the agent's pod leaves the node
    done = node.plane.kubectl("label", "node", node.name, f"{guide.migrate_label}-")
    assert done.returncode == 0, done.stderr
    eventually_sync(lambda: not guide.agent_pods(), "the agent's pod gone after the label",
                    timeout=WAIT_S, interval=0.3, explain=guide.diagnose)  # fmt: skip
    for line in guide.timings:
        report_line(f"migration guide on a real kubelet: {line}")
