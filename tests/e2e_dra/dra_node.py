"""A real `gpuslice plugin --dra` process on a simulated node, with the DRA kubelet
emulator, the Kubernetes API double and the allocator playing the scheduler."""

from __future__ import annotations

import contextlib
import stat
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuslice.backends.simulated.control import ControlDir
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.jsontypes import Json
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.eventually import eventually

DRIVER = "gpu.nvidia.com"
NODE = "n1"
STARTUP_S = 30.0
FAKE_MPS = f"{sys.executable} -m gpuslice.emulator.fake_mps_control"

GPU_CLASS: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ]
    },
}
MIG_CLASS: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "mig.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'mig'"
                }
            }
        ]
    },
}


def fake_nvidia_smi(workdir: Path, *, fail: str = "") -> Path:
    """An `nvidia-smi` that records its arguments (and fails with `fail` when given)."""
    script = workdir / "nvidia-smi"
    record = workdir / "nvidia-smi.calls"
    body = f'echo "$*" >> {record}\n'
    if fail:
        body += f'echo "{fail}" >&2\nexit 3\n'
    script.write_text(f"#!/bin/sh\n{body}", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def claim_obj(name: str, requests: Sequence[Json], config: Sequence[Json] = ()) -> Json:
    spec: Json = {"devices": {"requests": list(requests)}}
    if config:
        spec["devices"]["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def request(name: str, device_class: str = "gpu.nvidia.com", **exactly: Any) -> Json:
    return {"name": name, "exactly": {"deviceClassName": device_class, **exactly}}


def opaque(parameters: Json, requests: Sequence[str] = (), driver: str = DRIVER) -> Json:
    out: Json = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        out["requests"] = list(requests)
    return out


@dataclass(slots=True)
class DraNode:
    api: FakeApiServer
    kubelet: DraKubeletEmulator
    daemon: DaemonProcess
    control: ControlDir
    workdir: Path
    plugin_dir: Path
    registry_dir: Path
    cdi_root: Path
    config: Path

    def slices(self) -> list[Json]:
        return self.api.resource_slices(NODE, DRIVER)

    def log(self) -> str:
        """The daemon's log without the HTTP client's request lines."""
        lines = self.daemon.log().splitlines()
        return "\n".join(ln for ln in lines if "logger=httpx" not in ln)

    def devices(self) -> dict[str, Json]:
        return {d["name"]: d for s in self.slices() for d in s["spec"]["devices"]}

    async def wait(self, predicate: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
        def log_tail() -> str:
            log = "\n".join(ln for ln in self.daemon.log().splitlines() if "logger=httpx" not in ln)
            return log[-6000:]

        await eventually(
            predicate,
            what,
            timeout=timeout_s,
            explain=log_tail,
            give_up=lambda: not self.daemon.running,
        )

    def allocate(
        self, claim: Json, pod_uid: str = "pod-uid-1", *, devices: dict[str, str] | None = None
    ) -> ClaimRef:
        """Create the claim and allocate it as the scheduler would (the allocator), or to
        the given request -> device names (to allocate what no scheduler would)."""
        created = self.api.add_claim(claim)
        ns, name = created["metadata"]["namespace"], created["metadata"]["name"]
        if devices is not None:
            allocation: Json = {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": NODE, "device": d}
                        for r, d in devices.items()
                    ],
                    "config": [
                        dict(c, source="FromClaim")
                        for c in claim["spec"]["devices"].get("config", [])
                    ],
                }
            }
        else:
            from gpuslice.whatif.allocator import allocate

            others = [
                c["status"]["allocation"]
                for c in self.api.claims()
                if c.get("status", {}).get("allocation") and c["metadata"]["name"] != name
            ]
            allocation = allocate(
                created, self.api.device_classes(), self.slices(), others, node=NODE
            )
        self.api.set_claim_status(
            ns,
            name,
            {
                "allocation": allocation,
                "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": pod_uid}],
            },
        )
        return ClaimRef(ns, created["metadata"]["uid"], name)

    async def prepare(self, *refs: ClaimRef) -> dict[str, PrepareResult]:
        return dict(await self.kubelet.prepare(DRIVER, list(refs)))

    async def unprepare(self, *refs: ClaimRef) -> dict[str, str]:
        return dict(await self.kubelet.unprepare(DRIVER, list(refs)))

    def cdi_spec(self, claim_uid: str) -> Json:
        path = self.cdi_root / f"k8s.gpuslice.io-claim_{claim_uid}.yaml"
        loaded: Json = yaml.safe_load(path.read_text(encoding="utf-8"))
        return loaded

    def nvidia_smi_calls(self) -> list[str]:
        path = self.workdir / "nvidia-smi.calls"
        return path.read_text(encoding="utf-8").splitlines() if path.exists() else []

    async def restart_daemon(self) -> None:
        code = await self.daemon.terminate()
        assert code == 0, self.daemon.log()
        await self.daemon.start()


@contextlib.asynccontextmanager
async def running_dra_node(
    workdir: Path,
    api: FakeApiServer,
    *,
    node: str = "sim:1xh100-80gb",
    config: str = "version: v1\n",
    args: Sequence[str] = (),
    nvidia_smi_fail: str = "",
    kubelet_versions: Sequence[str] | None = None,
    plugin_files: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    compute_mode: bool = False,
) -> AsyncIterator[DraNode]:
    """`plugin_files`: files already in the plugin directory (another driver's state);
    `env`: more environment for the daemon (and the programs it runs); `compute_mode`: the
    agent sets MPS GPUs' compute modes (through the recording `nvidia-smi`)."""
    api.add_node(NODE)
    for cls in (GPU_CLASS, MIG_CLASS):
        api.add_device_class(cls)
    registry = workdir / "reg"
    registry.mkdir()
    plugin_dir = workdir / "plug"
    for name, text in (plugin_files or {}).items():
        plugin_dir.mkdir(exist_ok=True)
        (plugin_dir / name).write_text(text, encoding="utf-8")
    cdi_root = workdir / "cdi"
    config_path = workdir / "config.yaml"
    config_path.write_text(config, encoding="utf-8")
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    smi = fake_nvidia_smi(workdir, fail=nvidia_smi_fail)
    kwargs: dict[str, Any] = {"tick_s": 0.5}
    if kubelet_versions is not None:
        kwargs["versions"] = tuple(kubelet_versions)
    kubelet = DraKubeletEmulator(registry, **kwargs)
    await kubelet.start()
    control_dir = workdir / "ctl"
    daemon = DaemonProcess(
        [
            "--node", node,
            "--config-file", str(config_path),
            "--node-name", NODE,
            "--kubeconfig", str(kubeconfig),
            "--dra",
            "--dra-plugin-dir", str(plugin_dir),
            "--dra-registry-dir", str(registry),
            "--cdi-root", str(cdi_root),
            "--nvidia-smi", str(smi),
            "--dra-resync-interval", "0.5",
            *(() if compute_mode else ("--no-compute-mode",)),
            "--mps-control", FAKE_MPS,
            "--no-labels",
            *args,
        ],
        log_path=workdir / "daemon.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(control_dir), **(env or {})},
    )  # fmt: skip
    await daemon.start()
    state = DraNode(
        api, kubelet, daemon, ControlDir(control_dir), workdir, plugin_dir, registry, cdi_root,
        config_path,
    )  # fmt: skip
    try:
        await state.wait(
            lambda: kubelet.registration(DRIVER) is not None and bool(state.slices()),
            "registration and slices",
            STARTUP_S,
        )
        yield state
    finally:
        code = await daemon.terminate()
        await kubelet.stop()
    assert code == 0, f"daemon exit code {code}:\n{daemon.log()}"
