"""NVIDIA's DRA quickstart manifests (`tests/configs/nvidia-quickstart/`, copied unchanged
from NVIDIA's repository) applied to gpuslice in DRA mode on a real node: the real API server
validates them, the controller-manager makes their ResourceClaimTemplates into claims (and
Deployments into pods), the scheduler allocates from gpuslice's slices with the CEL of
NVIDIA's own DeviceClasses, and the kubelet and containerd prepare the claims and start the
containers. What NVIDIA's quickstart shows (`kubectl logs` of `nvidia-smi -L`) is asserted
from inside the containers: which GPU each sees, by `NVIDIA_VISIBLE_DEVICES` and by the
device nodes containerd created from the claim's CDI spec.

Three things are changed at load time, in this module, never in the files: the image (no
registry here: the local busybox image), the command (`nvidia-smi -L` needs a GPU: the
container prints its environment and `/dev` instead), and `hostNetwork: true` (there is no
CNI on this node). The Node's `not-ready` taint is lifted (the manifests tolerate only
`nvidia.com/gpu`); NVIDIA's chart templates for the DeviceClasses are rendered by dropping
their Helm conditionals, as `helm template` with the chart's defaults would."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuslice.core.jsontypes import Json
from gpuslice.core.migcaps import CAPS_DEV_DIR, numbered_minors
from gpuslice.testing import realnode
from gpuslice.testing.realnode import AgentProcess, RealNode, sim_uuids

pytestmark = pytest.mark.timeout(240)

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "nvidia-quickstart"
DRIVER = "gpu.nvidia.com"
H100S = 7
MIG_LAYOUT = "3g.20gb*1+2g.10gb*1+1g.5gb*2"
WHOLE = H100S + 1
SIM = f"sim:{H100S}xh100-80gb,1xa100-40gb,4xa100-40gb/mig={MIG_LAYOUT}"
"""gpu-test1 takes two whole GPUs, gpu-test2 and gpu-test3 one each (applied together, as
NVIDIA's quickstart applies them), gpu-test-mps one, gpu-test5 two: seven H100s. One whole
A100 for gpu-test6's selector to meet. gpu-test4's four replicas each take one A100's four
MIG devices (NVIDIA's half-balanced layout of an A100-40GB)."""
MIG_DEVICES = 4 * 4
NAMESPACES = (
    "gpu-test6",
    "gpu-test1",
    "gpu-test2",
    "gpu-test3",
    "gpu-test4",
    "gpu-test-mps",
    "gpu-test5",
)
NULL_DEVICE = os.makedev(1, 3)
SCRIPT = (
    "env; echo --dev; ls /dev; echo --caps; ls /dev/nvidia-caps; "
    "echo --mps; ls /tmp/nvidia-mps; "
    "for u in /var/run/nvidia-container-devices/*; do echo listed:${u##*/}; done; "
    "echo done; exec sleep 3600"
)
"""Stands in for `nvidia-smi -L`: what the container was given, then `done`."""


def render_chart_template(text: str) -> Json:
    """NVIDIA's `deviceclass-*.yaml` chart template as `helm template` renders it with the
    chart's defaults on a cluster serving `resource.k8s.io/v1`: its `if`/`end`/variable
    lines dropped and its API version filled in."""
    lines = [ln for ln in text.splitlines() if not re.fullmatch(r"\s*\{\{-.*\}\}\s*", ln)]
    rendered = re.sub(r"\{\{[^}]*\}\}", "resource.k8s.io/v1", "\n".join(lines))
    return dict(yaml.safe_load(rendered))


def _adapt_pod_spec(spec: Json) -> None:
    spec["hostNetwork"] = True
    for container in spec["containers"]:
        container["image"] = realnode.IMAGE
        container["imagePullPolicy"] = "Never"
        container["command"] = ["/bin/busybox", "sh", "-c"]
        container["args"] = [SCRIPT]


def load(name: str) -> list[Json]:
    """A quickstart file's objects, with the image, the command and the host network
    substituted in its pods and pod templates (the only changes)."""
    docs = [d for d in yaml.safe_load_all((QUICKSTART / name).read_text()) if d]
    for doc in docs:
        if doc["kind"] == "Pod":
            _adapt_pod_spec(doc["spec"])
        elif doc["kind"] == "Deployment":
            _adapt_pod_spec(doc["spec"]["template"]["spec"])
    return docs


def _stand_in_devices(root: Path, gpus: int) -> None:
    """The driver root's `dev` with /dev/null's numbers under NVIDIA's names: what the CDI
    specs' device nodes point at, so containerd can stat and create them; MIG capability
    nodes for every minor the driver's numbering gives these GPUs."""
    dev = root / "dev"
    (dev / CAPS_DEV_DIR).mkdir(parents=True)
    names = [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    _, last = numbered_minors(gpus - 1, 14, 7)
    names += [f"{CAPS_DEV_DIR}/nvidia-cap{minor}" for minor in range(1, last + 1)]
    for name in names:
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, NULL_DEVICE)


@dataclass
class Quickstart(AgentProcess):
    uuids: list[str]
    plugin_dir: Path

    def apply(self, objects: list[Json]) -> None:
        """`kubectl apply` of the objects, namespaces first and their `default`
        ServiceAccount (the controller-manager's) awaited, as a user's cluster has it a
        moment after the namespace."""
        kubectl = self.node.plane.kubectl
        namespaces = [o for o in objects if o["kind"] == "Namespace"]
        for ns in namespaces:
            done = kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(ns))
            assert done.returncode == 0, done.stderr
            name: str = ns["metadata"]["name"]

            def account_made(name: str = name) -> bool:
                return kubectl("get", "sa", "default", "-n", name).returncode == 0

            self.wait(
                account_made,
                f"namespace {name}'s default ServiceAccount (made by the controller-manager)",
            )
        rest = {"apiVersion": "v1", "kind": "List",
                "items": [o for o in objects if o["kind"] != "Namespace"]}  # fmt: skip
        done = kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(rest))
        assert done.returncode == 0, done.stderr

    def pods(self, namespace: str) -> list[Json]:
        got = self.node.plane.kubectl("get", "pods", "-n", namespace, "-o", "json")
        assert got.returncode == 0, got.stderr
        return list(json.loads(got.stdout)["items"])

    def wait_running(self, namespace: str, count: int) -> list[Json]:
        """Until `count` pods of the namespace run and each container printed `done`."""
        seen: list[Json] = []

        def ready() -> bool:
            seen[:] = self.pods(namespace)
            for pod in seen:
                assert pod.get("status", {}).get("phase") not in ("Failed", "Succeeded"), pod
            return len(seen) == count and all(
                pod["status"].get("phase") == "Running"
                and all(
                    "done" in self.node.container_log(namespace, pod["metadata"]["name"], c["name"])
                    for c in pod["spec"]["containers"]
                )
                for pod in seen
            )

        self.wait(ready, f"{count} pods of {namespace} running", within_s=90)
        return seen

    def seen(self, namespace: str, pod: str, container: str) -> Json:
        """What one container was given: its NVIDIA_VISIBLE_DEVICES, the GPU device nodes
        in its /dev, and the toolkit's device list."""
        log = self.node.container_log(namespace, pod, container).splitlines()
        env = dict(ln.split("=", 1) for ln in log[: log.index("--dev")] if "=" in ln)
        dev = log[log.index("--dev") + 1 : log.index("--caps")]
        caps = log[log.index("--caps") + 1 : log.index("--mps")]
        mps = log[log.index("--mps") + 1 :]
        return {
            "caps": sorted(c for c in caps if c.startswith("nvidia-cap")),
            "mps_pipe": env.get("CUDA_MPS_PIPE_DIRECTORY"),
            "mps_sockets": sorted(m for m in mps if m == "control"),
            "visible": env.get("NVIDIA_VISIBLE_DEVICES"),
            "gpus": sorted(d for d in dev if re.fullmatch(r"nvidia\d+", d)),
            "control": sorted(d for d in dev if d in ("nvidiactl", "nvidia-uvm")),
            "listed": sorted(ln.removeprefix("listed:") for ln in log if ln.startswith("listed:")),
        }

    def gpu_of(self, namespace: str, pod: str, container: str) -> str:
        """The one GPU a container sees, checked to agree across the environment, the
        device node and the toolkit's list (the UUID `nvidia-smi -L` would print)."""
        seen = self.seen(namespace, pod, container)
        uuid = seen["visible"]
        assert uuid in self.uuids, seen
        assert seen["gpus"] == [f"nvidia{self.uuids.index(uuid)}"], seen
        assert seen["control"] == ["nvidia-uvm", "nvidiactl"], seen
        assert seen["listed"] == [uuid], seen
        assert seen["caps"] == [], seen
        return str(uuid)

    def smi_calls(self) -> list[str]:
        """The stand-in nvidia-smi's command lines, one a call."""
        calls = self.log_path.parent / "nvidia-smi.calls"
        return calls.read_text().splitlines() if calls.exists() else []

    def mps_commands(self, claim_uid: str) -> str:
        """What the claim's MPS control daemon (the fake one) was told, from its log."""
        dirs = list((self.plugin_dir / "mps").glob(f"{claim_uid}-*"))
        assert len(dirs) == 1, dirs
        return "\n".join(f.read_text() for f in sorted((dirs[0] / "log").glob("*")) if f.is_file())

    def claim_of(self, namespace: str, pod: Json) -> Json:
        """The claim the controller-manager made from the pod's one template."""
        [status] = pod["status"]["resourceClaimStatuses"]
        got = self.node.plane.kubectl(
            "get", "resourceclaim", status["resourceClaimName"], "-n", namespace, "-o", "json"
        )
        assert got.returncode == 0, got.stderr
        return dict(json.loads(got.stdout))


@pytest.fixture(scope="module")
def quickstart(
    real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Quickstart]:
    work = tmp_path_factory.mktemp("quickstart")
    # a short plugin directory: the claims' MPS control sockets live under it, at
    # `mps/<claim UID>-<hash>/pipe/control`, and a unix socket's path has at most 107 bytes
    # (the kubelet's `/var/lib/kubelet/plugins/gpu.nvidia.com` leaves room; the real node's
    # temporary root-dir would not)
    plugin_dir = Path(tempfile.mkdtemp(prefix="gsq-"))
    uuids = sim_uuids(SIM)
    driver_root = work / "driver-root"
    _stand_in_devices(driver_root, len(uuids))
    smi = work / "nvidia-smi"
    # the stand-in records its calls: the time-slice intervals claims set
    smi.write_text(f'#!/bin/sh\necho "$*" >> {work / "nvidia-smi.calls"}\nexit 0\n')
    smi.chmod(0o755)
    config = work / "config.yaml"
    config.write_text("version: v1\n", encoding="utf-8")
    real_node.untaint_not_ready()
    kubectl = real_node.plane.kubectl
    for template in ("deviceclass-gpu.yaml.tmpl", "deviceclass-mig.yaml.tmpl"):
        device_class = render_chart_template((QUICKSTART / template).read_text())
        done = kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(device_class))
        assert done.returncode == 0, done.stderr
    args = [
        "--dra",
        "--node", SIM,
        "--config-file", str(config),
        "--node-name", real_node.name,
        "--kubeconfig", str(real_node.plane.kubeconfig),
        "--dra-plugin-dir", str(plugin_dir),
        "--dra-registry-dir", str(real_node.plugins_registry),
        "--cdi-root", str(real_node.cdi_dir),
        "--nvidia-driver-root", str(driver_root),
        "--container-driver-root", str(driver_root),
        "--nvidia-smi", str(smi),
        "--dra-resync-interval", "0.5",
        "--no-compute-mode", "--no-labels",
        "--mps-control", f"{sys.executable} -m gpuslice.emulator.fake_mps_control",
    ]  # fmt: skip
    agent = AgentProcess.start(real_node, args, work / "driver.log")
    running = Quickstart(agent.node, agent.proc, agent.log_path, uuids, plugin_dir)

    def published() -> bool:
        selector = f"spec.nodeName={real_node.name},spec.driver={DRIVER}"
        got = kubectl("get", "resourceslices", "-o", "json", f"--field-selector={selector}")
        slices = json.loads(got.stdout)["items"] if got.returncode == 0 else []
        return sum(len(s["spec"].get("devices", [])) for s in slices) == WHOLE + MIG_DEVICES

    try:
        running.wait(published, "the node's GPUs published")
        running.wait(
            lambda: "event=dra-registered" in running.log_path.read_text(),
            "the kubelet registered the driver",
        )
        yield running
    finally:
        for ns in NAMESPACES:
            kubectl("delete", "namespace", ns, "--wait=false")
        running.stop("default")
        for template in ("deviceclass-gpu.yaml.tmpl", "deviceclass-mig.yaml.tmpl"):
            name = render_chart_template((QUICKSTART / template).read_text())["metadata"]["name"]
            kubectl("delete", "deviceclass", name, "--wait=false")
        shutil.rmtree(plugin_dir, ignore_errors=True)


def test_nvidia_chart_device_classes_render_as_helm_renders_them() -> None:
    """The rendering this module does in place of Helm keeps NVIDIA's selectors as written."""
    gpu = render_chart_template((QUICKSTART / "deviceclass-gpu.yaml.tmpl").read_text())
    assert gpu["apiVersion"] == "resource.k8s.io/v1"
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    [selector] = gpu["spec"]["selectors"]
    assert selector["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )


def test_gpu_test6_selects_by_an_index_nvidia_no_longer_publishes(quickstart: Quickstart) -> None:
    """gpu-test6 selects A100s by `device.attributes['gpu.nvidia.com'].index`, an attribute
    NVIDIA's driver stopped publishing in September 2025 (commit 36fc80ab, "Remove GPU index
    for CDI spec generation / attribute advertisement"); gpuslice publishes NVIDIA's current
    attributes, so on either driver the selector fails on a whole A100 and the pods stay
    Pending, the scheduler naming the missing key. (Run first: while the A100 is free its
    selector is evaluated.)"""
    quickstart.apply(load("gpu-test6.yaml"))
    kubectl = quickstart.node.plane.kubectl

    def refused_for_index() -> bool:
        pods = quickstart.pods("gpu-test6")
        for pod in pods:
            assert pod["status"].get("phase") == "Pending", pod["status"]
        got = kubectl("get", "events", "-n", "gpu-test6", "-o", "json")
        events = json.loads(got.stdout)["items"] if got.returncode == 0 else []
        return (
            any(
                e.get("reason") == "FailedScheduling"
                and "no such key: index" in e.get("message", "")
                for e in events
            )
            and len(pods) == 4
        )

    quickstart.wait(refused_for_index, "gpu-test6's pods refused by the scheduler for `index`")
    devices = _published_devices(quickstart)
    assert all("index" not in attrs for attrs in devices.values())
    done = kubectl("delete", "namespace", "gpu-test6", "--wait=false")
    assert done.returncode == 0, done.stderr


def test_gpu_test1_to_3_run_and_share_as_nvidia_shows(quickstart: Quickstart) -> None:
    """`kubectl apply --filename=gpu-test{1,2,3}.yaml`, as NVIDIA's quickstart README says:
    gpu-test1's two pods, each from its own claim of the template, get two distinct GPUs;
    gpu-test2's two containers share their pod's one claim, so one GPU; gpu-test3's two
    pods share the one global claim, so one GPU. Four claims, four different GPUs."""
    for name in ("gpu-test1.yaml", "gpu-test2.yaml", "gpu-test3.yaml"):
        quickstart.apply(load(name))
    quickstart.wait_running("gpu-test1", 2)
    quickstart.wait_running("gpu-test2", 1)
    quickstart.wait_running("gpu-test3", 2)

    test1 = [quickstart.gpu_of("gpu-test1", pod, "ctr") for pod in ("pod1", "pod2")]
    assert test1[0] != test1[1]
    test2 = {quickstart.gpu_of("gpu-test2", "pod", ctr) for ctr in ("ctr0", "ctr1")}
    assert len(test2) == 1
    test3 = {quickstart.gpu_of("gpu-test3", pod, "ctr") for pod in ("pod1", "pod2")}
    assert len(test3) == 1
    assert len({*test1, *test2, *test3}) == 4

    # the templates made one claim per pod (gpu-test1) and per pod (gpu-test2), by the
    # controller-manager; gpu-test3's one claim is reserved for both its pods
    kubectl = quickstart.node.plane.kubectl
    claims = json.loads(kubectl("get", "resourceclaims", "-n", "gpu-test1", "-o", "json").stdout)
    assert len(claims["items"]) == 2
    shared = json.loads(
        kubectl("get", "resourceclaim", "single-gpu", "-n", "gpu-test3", "-o", "json").stdout
    )
    assert sorted(r["name"] for r in shared["status"]["reservedFor"]) == ["pod1", "pod2"]


def _published_devices(quickstart: Quickstart) -> dict[str, Json]:
    """The node's published devices by name: their attributes, as the scheduler saw them."""
    kubectl = quickstart.node.plane.kubectl
    selector = f"spec.nodeName={quickstart.node.name},spec.driver={DRIVER}"
    got = kubectl("get", "resourceslices", "-o", "json", f"--field-selector={selector}")
    assert got.returncode == 0, got.stderr
    return {
        d["name"]: {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
        for s in json.loads(got.stdout)["items"]
        for d in s["spec"].get("devices", [])
    }


def test_gpu_test4_mig_devices_of_one_parent_per_pod(quickstart: Quickstart) -> None:
    """gpu-test4: a Deployment of four replicas, each pod's claim asking for four MIG devices
    by profile (`1g.5gb` twice, `2g.10gb`, `3g.20gb`) from NVIDIA's `mig.nvidia.com` class,
    constrained to one parent GPU (`matchAttribute: gpu.nvidia.com/parentUUID`); each
    container names its request. Each container sees its own request's MIG device and no
    other: that MIG UUID in `NVIDIA_VISIBLE_DEVICES`, its parent's device node, and the two
    capability nodes of its GPU and compute instance. Each pod fills one A100."""
    objects = load("gpu-test4.yaml")
    [template] = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
    profiles = {  # each request's profile, as its CEL selector names it
        r["name"]: re.findall(
            r"profile == '([^']+)'", r["exactly"]["selectors"][0]["cel"]["expression"]
        )[0]
        for r in template["spec"]["spec"]["devices"]["requests"]
    }
    quickstart.apply(objects)
    pods = quickstart.wait_running("gpu-test4", 4)
    devices = _published_devices(quickstart)
    parents = set()
    for pod in pods:
        name = pod["metadata"]["name"]
        claim = quickstart.claim_of("gpu-test4", pod)
        results = claim["status"]["allocation"]["devices"]["results"]
        by_request = {r["request"]: devices[r["device"]] for r in results}
        assert {d["type"] for d in by_request.values()} == {"mig"}
        [parent] = {d["parentUUID"] for d in by_request.values()}
        assert parent not in parents  # each pod its own A100
        parents.add(parent)
        minor = quickstart.uuids.index(parent)
        seen_caps = set()
        for container in pod["spec"]["containers"]:
            [claim_ref] = container["resources"]["claims"]
            device = by_request[claim_ref["request"]]
            assert device["profile"] == profiles[claim_ref["request"]]
            seen = quickstart.seen("gpu-test4", name, container["name"])
            assert seen["visible"] == device["uuid"], (container["name"], seen)
            assert seen["gpus"] == [f"nvidia{minor}"], seen
            assert seen["listed"] == [device["uuid"]], seen
            assert len(seen["caps"]) == 2, seen
            seen_caps.update(seen["caps"])
        assert len(seen_caps) == 8  # four devices, each its own GI and CI
    assert parents == set(quickstart.uuids[WHOLE:])


def test_gpu_test_mps_two_containers_are_clients_of_one_daemon(quickstart: Quickstart) -> None:
    """gpu-test-mps: two containers share one claim's GPU through MPS. Both see the same GPU
    and the claim's MPS pipe directory, where its control daemon's socket is; the daemon was
    started with the claim's `defaultActiveThreadPercentage: 50` and
    `defaultPinnedDeviceMemoryLimit: 10Gi` (10240M, for the GPU by its index: where NVIDIA's
    template names the UUID, gpuslice sends the index, `docs/configuration.md` says why)."""
    quickstart.apply(load("gpu-test-mps.yaml"))
    [pod] = quickstart.wait_running("gpu-test-mps", 1)
    uuids = set()
    for ctr in ("mps-ctr0", "mps-ctr1"):
        uuids.add(quickstart.gpu_of("gpu-test-mps", "test-pod", ctr))
        seen = quickstart.seen("gpu-test-mps", "test-pod", ctr)
        assert seen["mps_pipe"] == "/tmp/nvidia-mps", seen
        assert seen["mps_sockets"] == ["control"], seen
    [gpu] = uuids
    commands = quickstart.mps_commands(quickstart.claim_of("gpu-test-mps", pod)["metadata"]["uid"])
    assert "set_default_active_thread_percentage 50" in commands
    index = quickstart.uuids.index(gpu)
    assert f"set_default_device_pinned_mem_limit {index} 10240M" in commands


def test_gpu_test5_time_slicing_and_mps_requests_in_one_claim(quickstart: Quickstart) -> None:
    """gpu-test5: one claim of two requests, `ts-gpu` with TimeSlicing (interval Long) and
    `mps-gpu` with MPS; two containers name each. The two ts containers share one GPU, the
    two MPS containers another; the Long interval (3) is set on the first GPU only, and only
    the MPS containers are clients of an MPS daemon, which got the claim's limits."""
    quickstart.apply(load("gpu-test5.yaml"))
    [pod] = quickstart.wait_running("gpu-test5", 1)
    ts = {quickstart.gpu_of("gpu-test5", "pod0", c) for c in ("ts-ctr0", "ts-ctr1")}
    mps = {quickstart.gpu_of("gpu-test5", "pod0", c) for c in ("mps-ctr0", "mps-ctr1")}
    assert len(ts) == 1
    assert len(mps) == 1
    assert ts != mps
    [ts_gpu], [mps_gpu] = ts, mps
    for ctr in ("ts-ctr0", "ts-ctr1"):
        seen = quickstart.seen("gpu-test5", "pod0", ctr)
        assert (seen["mps_pipe"], seen["mps_sockets"]) == (None, []), seen
    for ctr in ("mps-ctr0", "mps-ctr1"):
        seen = quickstart.seen("gpu-test5", "pod0", ctr)
        assert (seen["mps_pipe"], seen["mps_sockets"]) == ("/tmp/nvidia-mps", ["control"]), seen
    calls = quickstart.smi_calls()
    assert f"compute-policy -i {ts_gpu} --set-timeslice 3" in calls
    assert not any(mps_gpu in call for call in calls), calls
    commands = quickstart.mps_commands(quickstart.claim_of("gpu-test5", pod)["metadata"]["uid"])
    assert "set_default_active_thread_percentage 50" in commands
    index = quickstart.uuids.index(mps_gpu)
    assert f"set_default_device_pinned_mem_limit {index} 10240M" in commands
    assert "set_default_device_pinned_mem_limit" not in commands.replace(
        f"set_default_device_pinned_mem_limit {index} ", ""
    )  # the time-sliced GPU is not the daemon's
