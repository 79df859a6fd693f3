"""A real node for the tests: the kubelet and containerd from `KUBEBUILDER_ASSETS`, Debian's
runc, and a busybox image built with buildah, registered with a `testing.envtest` control
plane.

The kubelet emulator answers as its authors understood the kubelet; this is the kubelet
itself, so device-plugin registration, Allocate, GetPreferredAllocation, PodResources, DRA
Prepare and Unprepare, and the CDI edits containerd applies are the ones a cluster runs.

What a machine without a cluster needs (the envtest README's list): root; containerd with its
own root, state and socket under a temporary directory, the `overlayfs` snapshotter where
this machine can mount an overlay there (else `native`, which copies every layer and every
container's root filesystem: 15-30 s per container of the agent's image), and
`restrict_oom_score_adj` (these machines refuse a negative score); the kubelet with the
cgroupfs driver, no swap or eviction checks, anonymous read on loopback, and pod logs
in /var/log/pods. There is no CNI, so pods run with `hostNetwork`, and the Node stays
NotReady; the control plane's controller-manager (where the tests start one) runs without
`nodelifecycle`, so nothing removes the `not-ready` taint: pods the scheduler places tolerate
it, or the test removes it (`untaint_not_ready`).

Two paths are the kubelet's own and not under its `--root-dir`: the device-plugin directory
`/var/lib/kubelet/device-plugins` (so one real node runs at a time) and the cgroups it makes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
POD_LOGS = Path("/var/log/pods")
IMAGE = "gpuslice.test/busybox:1"
"""A scratch image holding Debian's static busybox; also the pod sandbox ("pause") image."""
NODE_BINARIES = (
    "kubelet",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "kube-controller-manager",
)
HOST_TOOLS = {"runc": "runc", "buildah": "buildah", "busybox": "busybox-static"}
READY_S = 60.0


class RealNodeUnavailable(Exception):
    """What a real node needs and this machine lacks: the tests skip with this reason."""


def requirements() -> Path:
    """The assets directory, once everything a real node needs is known to be here."""
    try:
        bin_dir = envtest.assets()
    except envtest.EnvtestUnavailable as exc:
        raise RealNodeUnavailable(str(exc)) from exc
    if os.geteuid() != 0:
        raise RealNodeUnavailable("the kubelet and containerd need root")
    missing = [b for b in NODE_BINARIES if not (bin_dir / b).is_file()]
    if missing:
        raise RealNodeUnavailable(
            f"{envtest.ASSETS_ENV}={bin_dir} has no {', '.join(missing)} "
            "(`../shared/envtest/unpack.sh DIR` provides them)"
        )
    absent = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if absent:
        raise RealNodeUnavailable(
            f"Debian packages missing: {', '.join(absent)} (`apt-get install {' '.join(absent)}`)"
        )
    if _kubelet_listening():
        raise RealNodeUnavailable(
            f"a kubelet already serves {DEVICE_PLUGIN_DIR}/kubelet.sock on this machine"
        )
    return bin_dir


def _kubelet_listening() -> bool:
    path = DEVICE_PLUGIN_DIR / "kubelet.sock"
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _spawn(
    command: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def build_busybox_image(workdir: Path) -> Path:
    """An OCI archive of `IMAGE`: `FROM scratch` plus the static busybox, built by buildah
    without a daemon (vfs storage, chroot isolation) in `workdir`."""
    context = workdir / "image"
    context.mkdir(parents=True, exist_ok=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy2(Path(busybox).resolve(), context / "busybox")
    (context / "Containerfile").write_text(
        'FROM scratch\nCOPY busybox /bin/busybox\nCMD ["/bin/busybox", "sleep", "2147483647"]\n',
        encoding="utf-8",
    )
    store = ["--root", str(workdir / "buildah"), "--runroot", str(workdir / "buildah-run"),
             "--storage-driver", "vfs"]  # fmt: skip
    archive = workdir / "busybox.oci.tar"
    for command in (
        ["bud", "--isolation", "chroot", "--pull=never", "-q", "-t", IMAGE,
         "-f", str(context / "Containerfile"), str(context)],
        ["push", "-q", IMAGE, f"oci-archive:{archive}:{IMAGE}"],
    ):  # fmt: skip
        done = subprocess.run(
            ["buildah", *store, *command], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RealNodeUnavailable(f"buildah {command[0]} failed: {done.stderr.strip()}")
    return archive


def _snapshotter(workdir: Path) -> str:
    """`overlayfs` if an overlay mounts in `workdir` (not on every CI machine: an overlay
    root, or a container without the mount right, refuses it), else `native`."""
    probe = workdir / "overlay-probe"
    lower, upper, work, merged = (probe / name for name in ("l", "u", "w", "m"))
    for d in (lower, upper, work, merged):
        d.mkdir(parents=True)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    done = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    if done.returncode == 0:
        subprocess.run(["umount", str(merged)], capture_output=True, timeout=30, check=False)
    shutil.rmtree(probe, ignore_errors=True)
    return "overlayfs" if done.returncode == 0 else "native"


def _containerd_config(workdir: Path, cdi_dirs: Sequence[Path]) -> str:
    dirs = ", ".join(f"'{d}'" for d in cdi_dirs)
    return f"""version = 3
root = '{workdir / "containerd-root"}'
state = '{workdir / "containerd-state"}'
[grpc]
  address = '{workdir / "containerd.sock"}'
[ttrpc]
  address = '{workdir / "containerd.sock.ttrpc"}'
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = '{_snapshotter(workdir)}'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{IMAGE}'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    enable_cdi = true
    cdi_spec_dirs = [{dirs}]
"""


def _kubelet_config(workdir: Path, port: int) -> Json:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{workdir / 'containerd.sock'}",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "evictionHard": {},
        "nodeStatusUpdateFrequency": "2s",
        # how soon a changed ConfigMap reaches a running pod's volume (default 1 min): the
        # chart's configs are mounted from one and the agent reloads them live
        "syncFrequency": "5s",
        # the control plane's DRA gates, so the kubelet passes claims' new fields through
        "featureGates": {gate.split("=")[0]: True for gate in envtest.GATES.split(",")},
    }


@dataclass
class RealNode:
    """A kubelet and containerd, running; its Node object is `name` on `plane`."""

    plane: envtest.ControlPlane
    bin_dir: Path
    workdir: Path
    name: str
    cdi_dir: Path
    containerd: subprocess.Popen[bytes] | None = None
    kubelet: subprocess.Popen[bytes] | None = None
    kubelet_starts: int = 0
    _port: int = field(default_factory=envtest.free_port)

    @property
    def root_dir(self) -> Path:
        return self.workdir / "kubelet-root"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def plugins_registry(self) -> Path:
        return self.root_dir / "plugins_registry"

    def plugin_dir(self, driver: str) -> Path:
        return self.root_dir / "plugins" / driver

    def _env(self) -> dict[str, str]:
        # containerd finds its shim, and the shim runc, on PATH
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}

    def start_containerd(self, image: Path) -> None:
        config = self.workdir / "containerd.toml"
        config.write_text(_containerd_config(self.workdir, [self.cdi_dir]), encoding="utf-8")
        self.containerd = _spawn(
            [str(self.bin_dir / "containerd"), "--config", str(config)],
            self.workdir / "containerd.log",
            self._env(),
        )
        sock = self.workdir / "containerd.sock"
        _wait(lambda: sock.exists(), 30, "containerd never opened its socket", self.containerd)
        done = self.ctr("images", "import", str(image))
        if done.returncode != 0:
            raise RuntimeError(f"ctr images import failed: {done.stderr}")

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.workdir / "containerd.sock"),
             "-n", "k8s.io", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def start_kubelet(self) -> None:
        """Start (or start again) the kubelet; returns once its Node is registered and its
        device-plugin registration socket is there."""
        config = self.workdir / "kubelet.yaml"
        config.write_text(json.dumps(_kubelet_config(self.workdir, self._port)), encoding="utf-8")
        registration = DEVICE_PLUGIN_DIR / "kubelet.sock"
        with contextlib.suppress(FileNotFoundError):
            registration.unlink()
        self.kubelet_starts += 1
        self.kubelet = _spawn(
            [str(self.bin_dir / "kubelet"), "--config", str(config),
             "--root-dir", str(self.root_dir), "--kubeconfig", str(self.plane.kubeconfig),
             "--hostname-override", self.name],
            self.workdir / "kubelet.log",
            self._env(),
        )  # fmt: skip
        _wait(
            lambda: _kubelet_listening() and self.node_exists(),
            READY_S,
            "the kubelet never registered",
            self.kubelet,
            self.kubelet_log,
        )

    def stop_kubelet(self) -> None:
        _stop(self.kubelet)
        self.kubelet = None

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()

    def create(self, obj: Json) -> None:
        """Create an object as admin (an existing one is left as it is). The server's
        OpenAPI is not served to kubectl here, so client-side validation is off."""
        done = self.plane.kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(obj))
        if done.returncode != 0 and "AlreadyExists" not in done.stderr:
            raise RuntimeError(f"kubectl create {obj.get('kind')}: {done.stderr}")

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace and its `default` ServiceAccount, which the ServiceAccount admission
        plugin requires of every pod: made here at once rather than waited for from a
        controller-manager (a plane without one has nobody to make it)."""
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        self.create({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "default", "namespace": namespace}})  # fmt: skip

    def untaint_not_ready(self) -> None:
        """Remove the `node.kubernetes.io/not-ready` taint the API server put on the Node
        when the kubelet registered it: with no CNI the Node never becomes Ready, and with
        no `nodelifecycle` controller nothing would lift it. Manifests written for a real
        cluster, which tolerate only their own taints, then schedule here unchanged."""
        node = self.node()
        taints = node.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != "node.kubernetes.io/not-ready"]
        if kept != taints:
            patch = json.dumps({"spec": {"taints": kept or None}})
            done = self.plane.kubectl("patch", "node", self.name, "--type=merge", "-p", patch)
            assert done.returncode == 0, done.stderr

    def node_exists(self) -> bool:
        return self.plane.kubectl("get", "node", self.name, "-o", "name").returncode == 0

    def node(self) -> Json:
        done = self.plane.kubectl("get", "node", self.name, "-o", "json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def allocatable(self, resource: str) -> str | None:
        value = self.node().get("status", {}).get("allocatable", {}).get(resource)
        return None if value is None else str(value)

    def kubelet_log(self) -> str:
        return _tail(self.workdir / "kubelet.log")

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container wrote, from the kubelet's log files (the API server cannot reach
        the kubelet for `kubectl logs` here). The kubelet keeps them under /var/log/pods
        whatever `podLogsDirectory` says, so the pod's UID tells this run's apart."""
        got = self.plane.kubectl(
            "get", "pod", pod, "-n", namespace, "-o", "jsonpath={.metadata.uid}"
        )
        if got.returncode != 0 or not got.stdout:
            return ""
        texts = []
        for path in sorted(POD_LOGS.glob(f"{namespace}_{pod}_{got.stdout}/{container}/*.log")):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                # CRI log format: <time> <stream> <P|F> <text>
                parts = line.split(" ", 3)
                texts.append(parts[3] if len(parts) == 4 else "")
        return "\n".join(texts)

    def stop(self) -> None:
        """Pods' containers stopped by containerd, then the kubelet and containerd; anything
        still mounted under the work directory is unmounted so it can be removed."""
        for task in self._tasks():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task)
        deadline = time.monotonic() + 10
        while self._tasks() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop_kubelet()
        _stop(self.containerd)
        self.containerd = None
        _kill_shims(self.workdir)
        _unmount_under(self.workdir)

    def _tasks(self) -> list[str]:
        if self.containerd is None or self.containerd.poll() is not None:
            return []
        done = self.ctr("tasks", "ls", "-q")
        return [t for t in done.stdout.split() if t] if done.returncode == 0 else []


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def _wait(
    ready: Callable[[], bool],
    within_s: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log: Callable[[], str] | None = None,
) -> None:
    deadline = time.monotonic() + within_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: it exited with {proc.returncode}\n{log() if log else ''}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {within_s:.0f} s\n{log() if log else ''}")
        time.sleep(0.1)


def _kill_shims(workdir: Path) -> None:
    """containerd's shims outlive it by design; those serving this node's socket go."""
    marker = str(workdir / "containerd.sock").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"containerd-shim" in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def _unmount_under(workdir: Path) -> None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(workdir.resolve())
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)


@contextlib.contextmanager
def running(plane: envtest.ControlPlane, name: str = "real-node-1") -> Iterator[RealNode]:
    """A real node on `plane` for the duration of the block (RealNodeUnavailable if this
    machine cannot run one)."""
    bin_dir = requirements()
    with contextlib.suppress(FileNotFoundError):
        # a stale checkpoint from an earlier kubelet would hand out its devices again
        (DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").unlink()
    tmp = Path(tempfile.mkdtemp(prefix="gs-node-"))
    try:
        image = build_busybox_image(tmp)
        cdi_dir = tmp / "cdi"
        cdi_dir.mkdir()
        node = RealNode(plane, bin_dir, tmp, name, cdi_dir)
        try:
            node.start_containerd(image)
            node.start_kubelet()
            yield node
        finally:
            node.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sim_uuids(spec: str) -> list[str]:
    """The GPU UUIDs of a simulated node spec, as the agent started with it will see them."""
    from gpuslice.backends import open_backend

    backend = open_backend(spec)
    try:
        return [gpu.uuid for gpu in backend.inventory().gpus]
    finally:
        backend.close()


def pod(
    name: str,
    namespace: str,
    script: str,
    *,
    node: str | None = None,
    limits: Mapping[str, str] | None = None,
    claims: Mapping[str, str] | None = None,
) -> Json:
    """A busybox pod running `script` with `sh -c` on the host network: placed on `node`
    directly, or left to the scheduler (tolerating the not-ready taint) when `claims` asks
    for DRA devices (`{request name in the pod: ResourceClaim name}`)."""
    container: Json = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "sh", "-c", script],
    }
    spec: Json = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if node is not None:
        spec["nodeName"] = node
    if limits:
        container["resources"] = {"limits": dict(limits)}
    if claims:
        spec["resourceClaims"] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
        container.setdefault("resources", {})["claims"] = [{"name": k} for k in claims]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@dataclass
class AgentProcess:
    """`gpuslice plugin` (either mode) run beside a real node, as its DaemonSet pod would,
    with its log kept: what the real-node tests of both modes drive pods through."""

    node: RealNode
    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls, node: RealNode, args: Sequence[str], log_path: Path, env: Mapping[str, str] = {}
    ) -> AgentProcess:
        """The agent runs the code the tests import (`PYTHONPATH` set to its source root):
        a checkout beside the one the interpreter has installed tests its own agent."""
        source_root = str(Path(__file__).resolve().parents[2])
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuslice", "plugin", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={
                    "PYTHONUNBUFFERED": "1",
                    "PATH": "/usr/bin:/bin",
                    "PYTHONPATH": source_root,
                    **env,
                },
            )
        return cls(node, proc, log_path)

    @classmethod
    def start_dra(
        cls,
        node: RealNode,
        work: Path,
        *,
        sim: str,
        driver: str,
        driver_root: Path,
        config: str = "version: v1\n",
        extra: Sequence[str] = (),
    ) -> AgentProcess:
        """The agent in DRA mode on the simulated node `sim`, as the real-node DRA tests run
        it: the node's kubelet directories and CDI root, `driver_root` for the device nodes,
        a stand-in `nvidia-smi` (no compute modes, no labels), `config` in `work`."""
        smi = work / "nvidia-smi"
        smi.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        smi.chmod(0o755)
        config_file = work / "config.yaml"
        config_file.write_text(config, encoding="utf-8")
        args = [
            "--dra",
            "--node", sim,
            "--config-file", str(config_file),
            "--node-name", node.name,
            "--kubeconfig", str(node.plane.kubeconfig),
            "--dra-plugin-dir", str(node.plugin_dir(driver)),
            "--dra-registry-dir", str(node.plugins_registry),
            "--cdi-root", str(node.cdi_dir),
            "--nvidia-driver-root", str(driver_root),
            "--container-driver-root", str(driver_root),
            "--nvidia-smi", str(smi),
            "--dra-resync-interval", "0.5",
            "--no-compute-mode", "--no-labels",
            *extra,
        ]  # fmt: skip
        return cls.start(node, args, work / "driver.log")

    def log(self) -> str:
        """The log's end, without the HTTP client's request lines."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(ln for ln in lines if "logger=httpx" not in ln)[-6000:]

    def wait(self, ok: Callable[[], bool], what: str, within_s: float = 45.0) -> None:
        """Until `ok()`; failing with the agent's and the kubelet's logs if the agent exits
        or the time runs out."""
        deadline = time.monotonic() + within_s
        while not ok():
            if self.proc.poll() is not None:
                raise AssertionError(f"the agent exited while waiting for {what}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}\n--- agent\n{self.log()}\n"
                    f"--- kubelet\n{self.node.kubelet_log()}"
                )
            time.sleep(0.2)

    def run_pod(self, manifest: Json, started: Callable[[str], bool]) -> Json:
        """Create the pod and wait until it runs and its container's output satisfies
        `started`; the pod as last read."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        self.node.create(manifest)
        seen: Json = {}

        def running() -> bool:
            got = self.node.plane.kubectl("get", "pod", name, "-n", namespace, "-o", "json")
            seen.update(json.loads(got.stdout) if got.returncode == 0 else {})
            phase = seen.get("status", {}).get("phase")
            assert phase not in ("Failed", "Succeeded"), seen.get("status")
            return phase == "Running" and started(self.node.container_log(namespace, name, "main"))

        self.wait(running, f"pod {namespace}/{name} running")
        return seen

    def delete_pod(self, namespace: str, name: str) -> None:
        kubectl = self.node.plane.kubectl
        kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force")
        self.wait(
            lambda: kubectl("get", "pod", name, "-n", namespace).returncode != 0,
            f"pod {namespace}/{name} gone",
        )

    def stop(self, namespace: str) -> None:
        """Its pods in `namespace` deleted, then SIGTERM (SIGKILL if it overstays)."""
        self.node.plane.kubectl(
            "delete", "pods", "-n", namespace, "--all", "--grace-period=0", "--force",
            "--wait=false",
        )  # fmt: skip
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
