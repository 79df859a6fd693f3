"""A real etcd, kube-apiserver, kube-scheduler and (on request) kube-controller-manager for
the tests, found as
controller-runtime's envtest finds them: in the directory `KUBEBUILDER_ASSETS` names
(`setup-envtest` users have one; `.ci/run` unpacks the project's copy from `shared/envtest`).

The API server runs on loopback ports in a temporary directory, with RBAC on, a token for an
admin in `system:masters`, a service-account key pair made with `openssl`, and DRA's gates.
It is started once per test run and stopped by PID. What the double (`testing.apiserver`)
only imitates, this answers as a cluster would: validation, admission policies, RBAC,
server-side apply.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ASSETS_ENV = "KUBEBUILDER_ASSETS"
TOKEN = "gpuslice-envtest-admin"
GATES = (
    "DRAConsumableCapacity=true,DRAPartitionableDevices=true,DRADeviceTaints=true,"
    "DRAAdminAccess=true,DRAPrioritizedList=true,DRAResourceClaimDeviceStatus=true,"
    "DRAExtendedResource=true,DRADeviceTaintRules=true"
)
RUNTIME_CONFIG = "resource.k8s.io/v1beta2=true"
"""DeviceTaintRule (DRADeviceTaintRules, beta and off in 1.36) is served in v1beta2 only."""
READY_S = 60.0
HOW_TO_GET = (
    "set KUBEBUILDER_ASSETS to a directory holding etcd, kube-apiserver and kubectl "
    "(`../shared/envtest/unpack.sh DIR`, or `setup-envtest use -p path`)"
)


class EnvtestUnavailable(Exception):
    """No binaries (or no openssl): the real-server tests skip, saying how to get them."""


def assets() -> Path:
    """The directory of the control-plane binaries; EnvtestUnavailable when there is none."""
    value = os.environ.get(ASSETS_ENV, "")
    if not value:
        raise EnvtestUnavailable(f"{ASSETS_ENV} is not set: {HOW_TO_GET}")
    root = Path(value)
    missing = [b for b in ("etcd", "kube-apiserver", "kubectl") if not (root / b).is_file()]
    if missing:
        raise EnvtestUnavailable(f"{ASSETS_ENV}={root} has no {', '.join(missing)}: {HOW_TO_GET}")
    if shutil.which("openssl") is None:
        raise EnvtestUnavailable("openssl is needed for the service-account keys")
    return root


PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOW_PORT = 10_000


def free_port() -> int:
    """A port no one listens on now (the caller binds it soon after), chosen below the
    kernel's ephemeral range: a port the kernel hands out for `bind(0)` or an outgoing
    connection (any test's HTTP or gRPC client) could be taken again between this check and
    the daemon's own bind, a race seen as "address already in use" on a loaded machine."""
    try:
        first_ephemeral = int(PORT_RANGE.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32_768
    high = max(first_ephemeral, LOW_PORT + 1_000)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOW_PORT, high)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))  # as the daemon binds its metrics and probes
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded machine: whatever the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ControlPlane:
    """etcd + kube-apiserver, running; `kubectl()` and `kubeconfig` talk to it as admin."""

    bin_dir: Path
    workdir: Path
    port: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    scheduler: bool = False
    """A kube-scheduler runs too (the assets hold one)."""
    controller_manager: bool = False
    """A kube-controller-manager runs too: ResourceClaims are made from templates and
    deallocated when their pods go, and each namespace gets its `default` ServiceAccount."""
    apiserver_command: list[str] = field(default_factory=list)
    """How kube-apiserver was started, so `restart_apiserver` starts it the same way."""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def kubectl(
        self,
        *args: str,
        as_user: str | None = None,
        extra: Sequence[tuple[str, str]] = (),
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl` as admin, or impersonating `as_user` with `extra` user info."""
        command = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        if as_user is not None:
            command.append(f"--as={as_user}")
            command.extend(f"--as-user-extra={key}={value}" for key, value in extra)
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=60, check=False, input=stdin
        )

    def log(self) -> str:
        return (self.workdir / "kube-apiserver.log").read_text(errors="replace")[-4000:]

    def restart_apiserver(self) -> None:
        """Kill kube-apiserver and start it again with the same flags (same port, same
        etcd), as after a crash: open watches are cut, the watch cache starts afresh (a
        watch from an older resourceVersion is 410 Gone), the data stays. Killed rather
        than stopped: a graceful stop waits for open watches to drain, several seconds.
        Returns once `/readyz` answers 200 again."""
        [index] = [i for i, p in enumerate(self.processes) if p.args == self.apiserver_command]
        self.processes[index].kill()
        self.processes[index].wait(10)
        self.processes[index] = _spawn(
            self.apiserver_command, self.workdir / "kube-apiserver.log", append=True
        )
        _wait_ready(self)

    def stop(self) -> None:
        """Stop each process and wait for it, the last started first: kube-apiserver's
        graceful shutdown writes to etcd, and with etcd stopped alongside it waited out
        the 10 s here every time."""
        for proc in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: envtest\n  cluster:\n    server: {url}\n"
        "    insecure-skip-tls-verify: true\n"
        f"users:\n- name: admin\n  user:\n    token: {TOKEN}\n"
        "contexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: admin\n"
        "current-context: envtest\n",
        encoding="utf-8",
    )


def _ready(url: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _spawn(command: list[str], log: Path, *, append: bool = False) -> subprocess.Popen[bytes]:
    with log.open("ab" if append else "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _wait_ready(plane: ControlPlane) -> None:
    deadline = time.monotonic() + READY_S
    while not _ready(plane.url):
        if time.monotonic() > deadline or any(p.poll() is not None for p in plane.processes):
            raise RuntimeError(f"kube-apiserver never became ready:\n{plane.log()}")
        time.sleep(0.2)


def start(
    bin_dir: Path, workdir: Path, *, scheduler: bool = True, controller_manager: bool = False
) -> ControlPlane:
    """Start etcd and kube-apiserver (and kube-scheduler, when `scheduler` and the assets
    hold one; kube-controller-manager likewise when `controller_manager`) in `workdir`;
    returns once `/readyz` answers 200. Tests that need no scheduler leave it out: one
    process less on a small machine. The controller-manager is off unless asked for: only
    what meets ResourceClaimTemplates, Deployments or ServiceAccount admission needs it."""
    key, cert = workdir / "sa.key", workdir / "sa.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "2", "-subj", "/CN=service-accounts"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (workdir / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    plane = ControlPlane(bin_dir, workdir, api_port)
    try:
        plane.processes.append(
            _spawn(
                [str(bin_dir / "etcd"), "--data-dir", str(workdir / "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
                 "--unsafe-no-fsync"],
                workdir / "etcd.log",
            )
        )  # fmt: skip
        plane.apiserver_command = [
            str(bin_dir / "kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", "127.0.0.1", "--secure-port", str(api_port),
            "--cert-dir", str(workdir / "certs"),
            "--service-account-key-file", str(cert),
            "--service-account-signing-key-file", str(key),
            "--service-account-issuer", "https://envtest.gpuslice.invalid",
            "--token-auth-file", str(workdir / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-cluster-ip-range", "10.0.0.0/24",
            "--feature-gates", GATES,
            "--runtime-config", RUNTIME_CONFIG,
        ]  # fmt: skip
        plane.processes.append(_spawn(plane.apiserver_command, workdir / "kube-apiserver.log"))
        _write_kubeconfig(plane.kubeconfig, plane.url)
        _wait_ready(plane)
        if scheduler and (bin_dir / "kube-scheduler").is_file():
            # DRA allocation is the scheduler's: claims of pods it places get their devices
            plane.processes.append(
                _spawn(
                    [str(bin_dir / "kube-scheduler"), "--kubeconfig", str(plane.kubeconfig),
                     "--leader-elect=false", "--bind-address", "127.0.0.1",
                     "--secure-port", str(free_port()), "--feature-gates", GATES],
                    workdir / "kube-scheduler.log",
                )
            )  # fmt: skip
            plane.scheduler = True
        if controller_manager:
            plane.processes.append(_start_controller_manager(plane, key))
            plane.controller_manager = True
    except BaseException:
        plane.stop()
        raise
    return plane


def _start_controller_manager(plane: ControlPlane, key: Path) -> subprocess.Popen[bytes]:
    """kube-controller-manager with every controller but `nodelifecycle` (which would taint
    and evict from a Node whose kubelet sends no heartbeat), signing service-account tokens
    with the key the API server verifies, the admin kubeconfig for all three of its
    clients. The root CA it publishes (`kube-root-ca.crt`, every pod's service-account
    `ca.crt`) is the API server's own self-signed serving chain, so a pod's in-cluster client
    verifies the server as on a cluster. EnvtestUnavailable when the assets hold none."""
    binary = plane.bin_dir / "kube-controller-manager"
    if not binary.is_file():
        raise EnvtestUnavailable(
            f"{ASSETS_ENV}={plane.bin_dir} has no kube-controller-manager: {HOW_TO_GET}"
        )
    kubeconfig = str(plane.kubeconfig)
    return _spawn(
        [str(binary), "--kubeconfig", kubeconfig,
         "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
         "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
         "--leader-elect=false", "--controllers", "*,-nodelifecycle",
         "--service-account-private-key-file", str(key),
         "--root-ca-file", str(plane.workdir / "certs" / "apiserver.crt"),
         "--use-service-account-credentials=false", "--feature-gates", GATES],
        plane.workdir / "kube-controller-manager.log",
    )  # fmt: skip


@contextlib.contextmanager
def running(*, scheduler: bool = True, controller_manager: bool = False) -> Iterator[ControlPlane]:
    """A control plane for the duration of the block (EnvtestUnavailable without binaries);
    `scheduler` and `controller_manager` are `start`'s."""
    bin_dir = assets()
    with tempfile.TemporaryDirectory(prefix="gs-envtest-") as tmp:
        plane = start(
            bin_dir, Path(tmp), scheduler=scheduler, controller_manager=controller_manager
        )
        try:
            yield plane
        finally:
            plane.stop()
