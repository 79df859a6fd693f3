"""Dynamic MIG under the real kubelet and containerd: an H100 in MIG mode with no instance,
marked dynamic (`flags.dynamicMig`). The scheduler allocates a `1g.10gb` partition from the
slices the agent published, the kubelet has the driver prepare it, the driver creates that
MIG device on the (simulated) GPU and writes its CDI spec, containerd applies it (the MIG
device's UUID, the GPU's node and its GI/CI capability nodes: stand-in character devices on a
machine with no GPU), and deleting the pod has the kubelet unprepare it, which destroys the
instance. The instance's life is read from the driver's record and its log (the simulated GPU
lives in the agent's process)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.agent.dynamic_mig import JOURNAL_NAME
from gpuslice.core.jsontypes import Json
from gpuslice.core.migcaps import numbered_minors
from gpuslice.testing import realnode
from gpuslice.testing.realnode import AgentProcess, RealNode

pytestmark = pytest.mark.timeout(180)

SIM = "sim:1xh100-80gb/mig="
DRIVER = "gpu.nvidia.com"
NAMESPACE = "dynmig"
MIG_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "mig.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression":
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    }}]},
}  # fmt: skip
STAND_INS = ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
NULL_DEVICE = os.makedev(1, 3)
SCRIPT = (
    "env | grep ^NVIDIA_VISIBLE_DEVICES=; "
    "[ -c /dev/nvidia0 ] && echo char:nvidia0; "
    "for c in /dev/nvidia-caps/*; do [ -c $c ] && echo cap:${c##*/}; done; "
    "exec sleep 3600"
)


def _stand_in_devices(root: Path) -> None:
    """The driver root's `dev`, with /dev/null's numbers under NVIDIA's names, the capability
    nodes of every GPU instance GPU 0 can have included (the driver reads no `nvidia-caps`
    major here, so the CDI spec names the host's nodes)."""
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in STAND_INS:
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, NULL_DEVICE)
    for gi in range(15):
        for minor in numbered_minors(0, gi, 0):
            os.mknod(dev / "nvidia-caps" / f"nvidia-cap{minor}", 0o666 | stat.S_IFCHR, NULL_DEVICE)


@pytest.fixture(scope="module")
def driver(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    work = tmp_path_factory.mktemp("dynmig")
    driver_root = work / "driver-root"
    _stand_in_devices(driver_root)
    real_node.ensure_namespace(NAMESPACE)
    real_node.create(MIG_CLASS)
    agent = AgentProcess.start_dra(
        real_node,
        work,
        sim=SIM,
        driver=DRIVER,
        driver_root=driver_root,
        config="version: v1\nflags:\n  dynamicMig: {}\n",
    )
    try:
        agent.wait(lambda: len(slices(agent)) == 2, "the device slice and the counter slice")
        agent.wait(
            lambda: agent.log_path.read_text().count("event=dra-registered") >= 1,
            "the kubelet registered the driver",
        )
        yield agent
    finally:
        agent.stop(NAMESPACE)


def slices(agent: AgentProcess) -> list[Json]:
    got = agent.node.plane.kubectl(
        "get", "resourceslices", "-o", "json",
        f"--field-selector=spec.nodeName={agent.node.name},spec.driver={DRIVER}",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return list(json.loads(got.stdout)["items"])


def record(agent: AgentProcess) -> list[Json]:
    path = agent.node.plugin_dir(DRIVER) / JOURNAL_NAME
    return list(json.loads(path.read_text())["data"]["records"])


def test_a_pod_gets_its_dynamically_created_mig_device_and_deleting_it_destroys_it(
    driver: AgentProcess,
) -> None:
    selector = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    driver.node.create({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "small", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": selector}}],
        }}]}},
    })  # fmt: skip
    manifest = realnode.pod("small", NAMESPACE, SCRIPT, claims={"mig": "small"})
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": driver.node.name}
    driver.run_pod(manifest, started=lambda log: "char:" in log)

    [made] = record(driver)
    assert made["profile"] == "1g.10gb"
    created = made["created"]
    log = driver.node.container_log(NAMESPACE, "small", "main").splitlines()
    [visible] = [ln.split("=", 1)[1] for ln in log if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible == created["uuid"]
    caps = {ln.removeprefix("cap:") for ln in log if ln.startswith("cap:")}
    gi, ci = numbered_minors(0, created["giID"], created["ciID"])
    assert caps == {f"nvidia-cap{gi}", f"nvidia-cap{ci}"}
    assert "event=dynamic-mig-created" in driver.log_path.read_text()

    driver.delete_pod(NAMESPACE, "small")
    driver.wait(lambda: record(driver) == [], "the instance destroyed at Unprepare")
    assert (
        f"mig={created['uuid']}"
        in driver.log_path.read_text().split("event=dynamic-mig-destroyed", 1)[1]
    )
