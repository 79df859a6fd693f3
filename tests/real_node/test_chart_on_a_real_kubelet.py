"""The chart as a platform team deploys it: the image built by scripts/build-image, imported
into the node's containerd, `helm install`ed with real Helm (helm-sdkpy) into the real API
server, and its DaemonSet's pod run by the real kubelet under the chart's own security
context, host mounts, service account and probes. Both modes, then the lifecycle: `helm
upgrade` of the config (reloaded live through the kubelet's ConfigMap volume) and of the
image tag (the DaemonSet rolls) while a workload keeps its GPU, and `helm uninstall`.

What the test node differs in from a cluster, each set through an ordinary value:
- no CNI, so only host-network pods run: `hostNetwork: true`, the metrics and probe ports
  chosen free on the host;
- no kube-proxy, so the `kubernetes` Service's cluster IP leads nowhere: `extraEnv` points
  the in-cluster client at the API server's loopback address (the pod's own service-account
  token and CA are used, so the chart's RBAC and admission policies are what it meets);
- the kubelet's root directory is a temporary one: `podResourcesDir` and the `dra.*`
  directories name it;
- no GPU: `GPUSLICE_NODE=sim:...` (`extraEnv`) selects the simulated backend, and DRA's CDI
  specs point at stand-in character devices under `nvidiaDriverRoot`.
The tests run in file order and share one release name; each leaves the node as the next
expects it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest, realnode
from gpuslice.testing.eventually import eventually_sync
from gpuslice.testing.image import Buildah, default_cache
from gpuslice.testing.realnode import RealNode, sim_uuids

# The first test's setup builds the image when tests/image has not (scripts/build-image:
# 30-150 s on a loaded 2-core machine with the base cached, minutes when mmdebstrap makes it).
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuslice"
RELEASE = "gpuslice"
NAMESPACE = "gpuslice-system"
WORKLOADS = "chart-workloads"
SIM = "sim:2xa100-40gb"
DRIVER = "gpu.nvidia.com"
CONFIG_NAME = "shared"


def sharing(replicas: int) -> str:
    """The release's one named config: every GPU time-sliced `replicas` ways."""
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


HELM_TIMEOUT_S = 150
WAIT_S = 60.0
STAND_INS = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
PRINT_ENV = "env | grep ^NVIDIA_VISIBLE_DEVICES=; exec sleep 3600"
CLAIM_SCRIPT = (
    "env | grep ^NVIDIA_VISIBLE_DEVICES=; "
    "for d in nvidia0 nvidia1 nvidiactl nvidia-uvm; do "
    "[ -c /dev/$d ] && echo char:$d; done; exec sleep 3600"
)


try:
    from helm_sdkpy.actions import Configuration, Install, Uninstall, Upgrade
except ImportError:  # the chart tooling is missing: say so before starting a node for nothing
    pytest.skip(
        "helm-sdkpy is not installed: pip install --ignore-requires-python "
        "-r scripts/requirements-chart.txt",
        allow_module_level=True,
    )


def wait_for(ok: Callable[[], bool], what: str, diagnose: Callable[[], str] | None = None) -> None:
    """Until `ok()`, polled every 0.3 s (each check runs kubectl or reads the node's files)."""
    eventually_sync(ok, what, timeout=WAIT_S, interval=0.3, explain=diagnose)


@dataclass
class Deployment:
    """The real node, the image in its containerd, and the release's values."""

    node: RealNode
    repository: str
    tags: tuple[str, str]
    """The built image's tag and a second tag of the same image (an "upgrade" to roll to)."""
    work: Path
    metrics_port: int = field(default_factory=envtest.free_port)
    probe_port: int = field(default_factory=envtest.free_port)
    timings: list[str] = field(default_factory=list)
    uuids: list[str] = field(default_factory=lambda: sim_uuids(SIM))

    @property
    def kubectl(self) -> Callable[..., subprocess.CompletedProcess[str]]:
        return self.node.plane.kubectl

    def values(self, *, tag: str | None = None, replicas: int = 4, **extra: Any) -> Json:
        plane = self.node.plane
        values: Json = {
            "image": {
                "repository": self.repository,
                "tag": tag or self.tags[0],
                "pullPolicy": "Never",
            },
            "hostNetwork": True,
            "podResourcesDir": str(self.node.root_dir / "pod-resources"),
            "mps": {"root": str(self.work / "mps")},
            "labels": {"mode": "api"},
            "metrics": {"port": self.metrics_port},
            # probed every second once the agent has had 3 s to start its listener (the
            # chart's default waits 10 s), and two failed liveness probes restart it: a
            # restart count of 0 then says the probes in the tests' time passed
            "probes": {
                "port": self.probe_port,
                "readiness": {"periodSeconds": 1},
                "liveness": {"initialDelaySeconds": 3, "periodSeconds": 1, "failureThreshold": 2},
            },
            "config": {"map": {CONFIG_NAME: sharing(replicas)}, "default": CONFIG_NAME},
            "extraEnv": [
                {"name": "GPUSLICE_NODE", "value": SIM},
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(plane.port)},
            ],
        }
        values.update(extra)
        return values

    def _helm(self) -> Any:
        return Configuration(namespace=NAMESPACE, kubeconfig=str(self.node.plane.kubeconfig))

    def _timed(self, what: str, run: Callable[[], Any]) -> None:
        started = time.monotonic()
        try:
            run()
        except Exception as exc:
            raise AssertionError(f"{what} failed: {exc}\n{self.diagnose()}") from exc
        self.timings.append(f"{what}: {time.monotonic() - started:.1f} s")

    def install(self, values: Json, what: str = "helm install") -> None:
        self._timed(
            what,
            lambda: asyncio.run(
                Install(self._helm()).run(
                    RELEASE, str(CHART), values=values, wait=True, timeout=HELM_TIMEOUT_S
                )
            ),
        )

    def upgrade(self, values: Json, what: str) -> None:
        self._timed(
            what,
            lambda: asyncio.run(
                Upgrade(self._helm()).run(
                    RELEASE, str(CHART), values=values, wait=True, timeout=HELM_TIMEOUT_S
                )
            ),
        )

    def uninstall(self) -> None:
        self._timed(
            "helm uninstall",
            lambda: asyncio.run(
                Uninstall(self._helm()).run(RELEASE, wait=True, timeout=HELM_TIMEOUT_S)
            ),
        )

    def agent_pods(self) -> list[Json]:
        got = self.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json")
        assert got.returncode == 0, got.stderr
        return list(json.loads(got.stdout)["items"])

    def agent_pod(self) -> Json:
        pods = [p for p in self.agent_pods() if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def agent_log(self, pod: Json | None = None) -> str:
        pod = pod or self.agent_pod()
        return self.node.container_log(NAMESPACE, pod["metadata"]["name"], "gpuslice")

    def node_labels(self) -> dict[str, str]:
        return dict(self.node.node()["metadata"].get("labels") or {})

    def diagnose(self) -> str:
        parts = [self.kubectl("get", "pods,ds", "-A", "-o", "wide").stdout]
        parts.append(self.kubectl("get", "events", "-n", NAMESPACE).stdout[-3000:])
        for pod in self.agent_pods():
            status = pod.get("status", {})
            parts.append(f"--- {pod['metadata']['name']}: {json.dumps(status)[-1500:]}")
            parts.append(self.agent_log(pod)[-3000:])
        parts.append(f"--- kubelet\n{self.node.kubelet_log()[-3000:]}")
        return "\n".join(parts)

    def workload(self, name: str, limits: dict[str, str]) -> Json:
        manifest = realnode.pod(name, WORKLOADS, PRINT_ENV, node=self.node.name, limits=limits)
        return self.run_pod(manifest, lambda log: "NVIDIA_VISIBLE_DEVICES=" in log)

    def run_pod(self, manifest: Json, started: Callable[[str], bool]) -> Json:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        self.node.create(manifest)
        seen: Json = {}

        def running() -> bool:
            seen.clear()
            seen.update(self.pod(namespace, name))
            phase = seen.get("status", {}).get("phase")
            assert phase not in ("Failed", "Succeeded"), seen.get("status")
            return phase == "Running" and started(self.node.container_log(namespace, name, "main"))

        wait_for(running, f"pod {namespace}/{name} running", self.diagnose)
        return seen

    def pod(self, namespace: str, name: str) -> Json:
        got = self.kubectl("get", "pod", name, "-n", namespace, "-o", "json")
        return dict(json.loads(got.stdout)) if got.returncode == 0 else {}

    def visible_devices(self, pod: str) -> list[str]:
        text = self.node.container_log(WORKLOADS, pod, "main")
        [line] = [ln for ln in text.splitlines() if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
        return line.split("=", 1)[1].split(",")

    def delete_workloads(self) -> None:
        self.kubectl("delete", "pods", "-n", WORKLOADS, "--all", "--grace-period=0", "--force")
        wait_for(
            lambda: not self.kubectl("get", "pods", "-n", WORKLOADS, "-o", "name").stdout.strip(),
            "the workload pods gone",
        )


def _export(buildah: Buildah, tag: str, archive: Path) -> None:
    """The image as an OCI archive, which `ctr images import` reads (no registry here)."""
    # uncompressed: gzip would cost more time here than the larger file costs containerd
    buildah("push", "-q", "--disable-compression", tag, f"oci-archive:{archive}:{tag}",
            timeout_s=300)  # fmt: skip


@pytest.fixture(scope="module")
def deployment(
    real_node: RealNode, gpuslice_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("chart")
    repository, _, tag = gpuslice_image.rpartition(":")
    second = f"{tag}-rolled"
    started = time.monotonic()
    archive = work / "gpuslice.oci.tar"
    _export(Buildah(default_cache() / "storage"), gpuslice_image, archive)
    done = real_node.ctr("images", "import", str(archive))
    assert done.returncode == 0, f"ctr images import: {done.stderr}"
    archive.unlink()
    done = real_node.ctr("images", "tag", gpuslice_image, f"{repository}:{second}")
    assert done.returncode == 0, f"ctr images tag: {done.stderr}"
    deployed = Deployment(real_node, repository, (tag, second), work)
    deployed.timings.append(f"image export + containerd import: {time.monotonic() - started:.1f} s")
    # where the chart's affinity finds a GPU node (the GPU operator's label)
    done = real_node.plane.kubectl(
        "label", "node", real_node.name, "--overwrite", "nvidia.com/gpu.present=true"
    )
    assert done.returncode == 0, done.stderr
    real_node.untaint_not_ready()
    real_node.ensure_namespace(WORKLOADS)
    # made here, not by Helm's --create-namespace: Helm validates the Namespace it makes
    # against the server's OpenAPI v2 in protobuf, which this API server build cannot
    # produce (its log: "... contains an invalid Parameter"); the chart's own objects are
    # applied without that client-side validation
    real_node.ensure_namespace(NAMESPACE)
    try:
        yield deployed
    finally:
        deployed.kubectl("delete", "pods", "-n", WORKLOADS, "--all", "--grace-period=0",
                         "--force", "--wait=false")  # fmt: skip
        with contextlib.suppress(AssertionError):  # a release a failed test left behind
            deployed.uninstall()
        _remove_nvidia_labels(deployed)
        for image in (gpuslice_image, f"{repository}:{second}"):
            real_node.ctr("images", "rm", image)


def _remove_nvidia_labels(deployed: Deployment) -> None:
    """What docs/install.md ("Uninstall") tells users to do by hand in `labels.mode=api`."""
    stale = [k for k in deployed.node_labels() if k.startswith("nvidia.com/")]
    if stale:
        deployed.kubectl("label", "node", deployed.node.name, *[f"{k}-" for k in stale])


def _agent_process() -> int:
    """The host PID of the agent the kubelet started (the image's entrypoint)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"/opt/gpuslice/bin/gpuslice") for arg in cmdline):
            found.append(int(entry.name))
    assert len(found) == 1, f"agent processes: {found}"
    return found[0]


def _status_fields(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}


def _root_mount_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError("the container has no root mount")


def _startup(pod: Json) -> str:
    """When the pod's container started and when it turned Ready, in seconds after the pod
    was created (the API's timestamps, to the second)."""

    def at(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    created = at(pod["metadata"]["creationTimestamp"])
    [ready] = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    [container] = pod["status"]["containerStatuses"]
    started = at(container["state"]["running"]["startedAt"])
    ready_at = at(ready["lastTransitionTime"])
    return f"container started {started - created:.0f} s, Ready {ready_at - created:.0f} s after"


def complaints(log: str) -> list[str]:
    """The agent's warnings and errors: under the chart's security context and mounts it
    should have nothing to complain about on a healthy (simulated) node."""
    return [ln for ln in log.splitlines() if "level=warning" in ln or "level=error" in ln]


def _ready(pod: Json) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_charts_pod_runs_the_device_plugin_under_its_security_context(
    deployment: Deployment, report_line: Callable[[str], None]
) -> None:
    """`helm install --wait` returns once the DaemonSet's pod is Ready, which its readiness
    probe (`/readyz`: the kubelet accepted the registration) decides; the kubelet ran it as
    the chart says: root without a single capability, no privilege escalation, a read-only
    root filesystem and the runtime's default seccomp profile."""
    deployment.install(deployment.values())
    pod = deployment.agent_pod()
    assert _ready(pod)
    deployment.timings.append(f"agent pod: {_startup(pod)}")
    [container] = pod["status"]["containerStatuses"]
    assert container["restartCount"] == 0, deployment.agent_log(pod)
    node = deployment.node
    wait_for(
        lambda: node.allocatable("nvidia.com/gpu") == "8", "allocatable 8", deployment.diagnose
    )
    assert node.node()["status"]["capacity"]["nvidia.com/gpu"] == "8"  # 2 GPUs x 4 replicas
    labels = deployment.node_labels()
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"].endswith("-SHARED")

    status = _status_fields(_agent_process())
    assert status["Uid"].split()[:2] == ["0", "0"]
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0" * 16
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # a filter: RuntimeDefault
    assert "ro" in _root_mount_options(_agent_process())
    sockets = [
        p
        for p in realnode.DEVICE_PLUGIN_DIR.iterdir()
        if stat.S_ISSOCK(p.lstat().st_mode) and p.name != "kubelet.sock"
    ]
    assert sockets, "no plugin socket in the kubelet's device-plugins directory"
    assert all(p.lstat().st_uid == 0 for p in sockets)
    said = complaints(deployment.agent_log(pod))
    assert not said, "\n".join(said)
    for line in deployment.timings:
        report_line(f"chart on a real kubelet: {line}")


def test_a_workload_gets_a_gpu_from_the_charts_agent(deployment: Deployment) -> None:
    deployment.workload("keeper", {"nvidia.com/gpu": "1"})
    assert deployment.visible_devices("keeper")[0] in deployment.uuids


def test_helm_upgrade_reloads_the_config_live_and_rolls_the_image_while_a_workload_runs(
    deployment: Deployment, report_line: Callable[[str], None]
) -> None:
    """A changed config reaches the agent through the kubelet's ConfigMap volume (no roll:
    the chart has no checksum annotation); a changed image tag rolls the DaemonSet, the old
    agent stops and the new one registers, and the workload started before both keeps
    running with its GPU. A pod admitted after the roll gets a GPU from the new agent."""
    node = deployment.node
    before = deployment.agent_pod()
    [agent] = before["status"]["containerStatuses"]
    assert agent["restartCount"] == 0, "a liveness probe failed"
    keeper = deployment.pod(WORKLOADS, "keeper")
    [keeper_container] = keeper["status"]["containerStatuses"]
    keeper_gpu = deployment.visible_devices("keeper")

    deployment.upgrade(deployment.values(replicas=2), "helm upgrade (config)")
    wait_for(
        lambda: node.allocatable("nvidia.com/gpu") == "4",
        "the changed config applied live: 2 GPUs x 2",
        deployment.diagnose,
    )
    wait_for(lambda: deployment.node_labels().get("nvidia.com/gpu.replicas") == "2", "label 2")
    assert deployment.agent_pod()["metadata"]["uid"] == before["metadata"]["uid"]

    [agent] = deployment.agent_pod()["status"]["containerStatuses"]
    assert agent["restartCount"] == 0, "a liveness probe failed"
    deployment.upgrade(
        deployment.values(replicas=2, tag=deployment.tags[1]), "helm upgrade (image tag)"
    )
    after = deployment.agent_pod()
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["spec"]["containers"][0]["image"].endswith(f":{deployment.tags[1]}")
    assert _ready(after)
    wait_for(lambda: node.allocatable("nvidia.com/gpu") == "4", "allocatable 4 after the roll")

    keeper_now = deployment.pod(WORKLOADS, "keeper")
    assert keeper_now["status"]["phase"] == "Running"
    [container_now] = keeper_now["status"]["containerStatuses"]
    assert container_now["containerID"] == keeper_container["containerID"]
    assert container_now["restartCount"] == 0
    assert deployment.visible_devices("keeper") == keeper_gpu

    deployment.workload("after-roll", {"nvidia.com/gpu": "1"})
    assert deployment.visible_devices("after-roll")[0] in deployment.uuids
    deployment.delete_workloads()
    for line in deployment.timings[-2:]:
        report_line(f"chart on a real kubelet: {line}")


def test_helm_uninstall_leaves_the_node_as_docs_install_md_says(deployment: Deployment) -> None:
    """The agent's socket goes with its pod and the node stops offering the resource; the
    lock file stays (docs/install.md, "One agent per node") and, in `labels.mode=api`, so
    do the labels (docs/install.md, "Uninstall"), which the user removes by hand."""
    deployment.uninstall()
    # `helm uninstall --wait` waits for the DaemonSet object only: its pods go afterwards,
    # deleted by the garbage collector and stopped by the kubelet
    wait_for(lambda: not deployment.agent_pods(), "the agent's pod gone", deployment.diagnose)
    for kind in ("clusterroles", "clusterrolebindings", "validatingadmissionpolicies"):
        got = deployment.kubectl("get", kind, "-l", f"app.kubernetes.io/instance={RELEASE}",
                                 "-o", "name")  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert not got.stdout.strip(), (kind, got.stdout)
    left = sorted(p.name for p in realnode.DEVICE_PLUGIN_DIR.iterdir())
    assert left == ["gpuslice.lock", "kubelet.sock", "kubelet_internal_checkpoint"], left
    node = deployment.node
    wait_for(lambda: node.allocatable("nvidia.com/gpu") == "0", "nothing allocatable")
    assert deployment.node_labels().get("nvidia.com/gpu.replicas") == "2"
    docs = (ROOT / "docs" / "install.md").read_text()
    assert "in `labels.mode=api` the labels stay on the Nodes" in docs
    _remove_nvidia_labels(deployment)
    done = deployment.kubectl(
        "label", "node", node.name, "--overwrite", "nvidia.com/gpu.present=true"
    )
    assert done.returncode == 0, done.stderr


def _stand_in_devices(root: Path) -> None:
    """The driver root's `dev`, with /dev/null's numbers under NVIDIA's names: what the CDI
    specs' device nodes point at, so containerd can stat and create them."""
    dev = root / "dev"
    dev.mkdir(parents=True)
    for name in STAND_INS:
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _slices(deployment: Deployment) -> list[Json]:
    got = deployment.kubectl(
        "get", "resourceslices", "-o", "json",
        f"--field-selector=spec.nodeName={deployment.node.name},spec.driver={DRIVER}",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return list(json.loads(got.stdout)["items"])


def test_dra_mode_from_the_chart_registers_publishes_and_prepares_a_claim(
    deployment: Deployment, report_line: Callable[[str], None]
) -> None:
    """`dra.enabled`: the kubelet's plugin watcher finds the agent's registration socket in
    the mounted registry directory, the chart's DeviceClass selects the published devices,
    the scheduler allocates a claim, and containerd applies the CDI edits the agent wrote
    into the mounted CDI root; uninstalling removes the DRA sockets."""
    node = deployment.node
    driver_root = deployment.work / "driver-root"
    _stand_in_devices(driver_root)
    # DeviceClasses of another module's run would keep Helm from creating its own
    deployment.kubectl("delete", "deviceclass", "gpu.nvidia.com", "mig.nvidia.com",
                       "--ignore-not-found")  # fmt: skip
    values = deployment.values(
        dra={
            "enabled": True,
            "kubeletPluginsDir": str(node.root_dir / "plugins"),
            "registryDir": str(node.plugins_registry),
            "cdiRoot": str(node.cdi_dir),
        },
        nvidiaDriverRoot=str(driver_root),
    )
    deployment.install(values, "helm install (DRA)")
    pod = deployment.agent_pod()
    assert _ready(pod)
    wait_for(lambda: "event=dra-registered" in deployment.agent_log(), "the kubelet registered it")
    wait_for(lambda: len(_slices(deployment)) == 1, "the node's slice", deployment.diagnose)
    [published] = _slices(deployment)
    assert len(published["spec"]["devices"]) == 2
    # the stand-in driver root has device nodes but no driver libraries, and the node no
    # toolkit hook: the agent says so once, and claims name their GPUs in the environment
    # (agent.cdi_base; the base spec's own path runs in test_dra_base_spec_on_a_real_kubelet)
    said = complaints(deployment.agent_log())
    missing = [ln for ln in said if "event=dra-cdi-base-missing" in ln]
    assert len(missing) == 1, said
    assert "libcuda.so." in missing[0]
    others = [ln for ln in said if ln not in missing]
    assert not others, "\n".join(others)

    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "whole", "namespace": WORKLOADS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }  # fmt: skip
    node.create(claim)
    manifest = realnode.pod("claimer", WORKLOADS, CLAIM_SCRIPT, claims={"gpu": "whole"})
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    deployment.run_pod(manifest, lambda log: "char:" in log)
    got = deployment.kubectl("get", "resourceclaim", "whole", "-n", WORKLOADS, "-o", "json")
    claim_obj = json.loads(got.stdout)
    [result] = claim_obj["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, node.name)
    spec = node.cdi_dir / f"k8s.gpuslice.io-claim_{claim_obj['metadata']['uid']}.yaml"
    assert spec.is_file()
    log = node.container_log(WORKLOADS, "claimer", "main").splitlines()
    [visible] = [ln.split("=", 1)[1] for ln in log if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible in deployment.uuids
    chars = {ln.removeprefix("char:") for ln in log if ln.startswith("char:")}
    assert chars == {f"nvidia{deployment.uuids.index(visible)}", "nvidiactl", "nvidia-uvm"}

    # an image upgrade rolls the driver (maxSurge 0) under the running claim: the claim stays
    # prepared, its container keeps running, and the new agent, registered again, is the one
    # the kubelet asks to unprepare it when the pod goes
    before = deployment.agent_pod()
    [claimer_container] = deployment.pod(WORKLOADS, "claimer")["status"]["containerStatuses"]
    deployment.upgrade(dict(values, image={**values["image"], "tag": deployment.tags[1]}),
                       "helm upgrade (DRA, image tag)")  # fmt: skip
    after = deployment.agent_pod()
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    wait_for(lambda: "event=dra-registered" in deployment.agent_log(after), "registered again")
    [claimer_now] = deployment.pod(WORKLOADS, "claimer")["status"]["containerStatuses"]
    assert claimer_now["containerID"] == claimer_container["containerID"]
    assert claimer_now["restartCount"] == 0
    assert claimer_now["state"].get("running"), claimer_now["state"]
    assert spec.is_file(), "the claim's CDI spec went with the old agent"

    deployment.delete_workloads()
    wait_for(lambda: not spec.exists(), "the claim's CDI spec removed at Unprepare")
    unprepared = [
        ln
        for ln in deployment.agent_log(after).splitlines()
        if "event=dra-unprepared" in ln and claim_obj["metadata"]["uid"] in ln
    ]
    assert unprepared, "the new agent did not unprepare the claim"
    deployment.kubectl("delete", "resourceclaim", "whole", "-n", WORKLOADS, "--wait=false")
    deployment.uninstall()
    wait_for(lambda: not deployment.agent_pods(), "the agent's pod gone", deployment.diagnose)
    plugin_dir = node.root_dir / "plugins" / DRIVER
    sockets = [
        p
        for d in (node.plugins_registry, plugin_dir)
        if d.is_dir()
        for p in d.iterdir()
        if stat.S_ISSOCK(p.lstat().st_mode)
    ]
    assert not sockets, sockets
    # the claim's CDI spec went at Unprepare; the node's ResourceSlice stays until the
    # kubelet wipes the slices of a driver that has unregistered (about 30 s later, measured
    # with v1.36: not waited for here; docs/install.md, "Uninstall")
    assert not list(node.cdi_dir.iterdir())
    for line in deployment.timings[-3:]:
        report_line(f"chart on a real kubelet: {line}")
