"""The DRA driver under the real kubelet: the scheduler allocates a claim from the slices the
agent published, the kubelet has the driver prepare it, containerd applies the claim's CDI
edits to the container (the environment and the device nodes, stand-in character devices on
a machine with no GPU), and deleting the pod has the kubelet unprepare it. A kubelet restart,
which deletes the node's slices, is repaired and the driver registers again."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.testing import realnode
from gpuslice.testing.realnode import AgentProcess, RealNode, sim_uuids

pytestmark = pytest.mark.timeout(180)

SIM = "sim:2xh100-80gb"
DRIVER = "gpu.nvidia.com"
NAMESPACE = "dra"
WAIT_S = 45.0
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression":
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    }}]},
}  # fmt: skip
STAND_INS = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
NULL_DEVICE = os.makedev(1, 3)


@dataclass
class Driver(AgentProcess):
    uuids: list[str]

    def slices(self) -> list[Json]:
        got = self.node.plane.kubectl(
            "get", "resourceslices", "-o", "json",
            f"--field-selector=spec.nodeName={self.node.name},spec.driver={DRIVER}",
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        return list(json.loads(got.stdout)["items"])


def _stand_in_devices(root: Path) -> None:
    """The driver root's `dev`, with /dev/null's numbers under NVIDIA's names: what the CDI
    spec's device nodes point at, so containerd can stat and create them."""
    dev = root / "dev"
    dev.mkdir(parents=True)
    for name in STAND_INS:
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, NULL_DEVICE)


@pytest.fixture(scope="module")
def driver(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    work = tmp_path_factory.mktemp("dra")
    driver_root = work / "driver-root"
    _stand_in_devices(driver_root)
    real_node.ensure_namespace(NAMESPACE)
    real_node.create(GPU_CLASS)
    agent = AgentProcess.start_dra(real_node, work, sim=SIM, driver=DRIVER, driver_root=driver_root)
    running = Driver(agent.node, agent.proc, agent.log_path, sim_uuids(SIM))
    try:
        running.wait(lambda: len(running.slices()) == 1, "the node's slice published")
        running.wait(_registered(running, 1), "the kubelet registered the driver")
        yield running
    finally:
        running.stop(NAMESPACE)


def _registered(driver: Driver, times: int) -> Callable[[], bool]:
    """The kubelet called the driver's NotifyRegistrationStatus with success `times` times."""
    return lambda: driver.log_path.read_text().count("event=dra-registered") >= times


def claim(name: str) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }  # fmt: skip


SCRIPT = (
    "env | grep ^NVIDIA_VISIBLE_DEVICES=; "
    "for d in nvidia0 nvidia1 nvidiactl nvidia-uvm; do "
    "[ -c /dev/$d ] && echo char:$d; done; exec sleep 3600"
)


def run_claim_pod(driver: Driver, name: str) -> Json:
    driver.node.create(claim(name))
    manifest = realnode.pod(name, NAMESPACE, SCRIPT, claims={"gpu": name})
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": driver.node.name}
    return driver.run_pod(manifest, started=lambda log: "char:" in log)


def allocated_claim(driver: Driver, name: str) -> Json:
    got = driver.node.plane.kubectl("get", "resourceclaim", name, "-n", NAMESPACE, "-o", "json")
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


def spec_file(driver: Driver, claim_uid: str) -> Path:
    return driver.node.cdi_dir / f"k8s.gpuslice.io-claim_{claim_uid}.yaml"


def delete_pod(driver: Driver, name: str) -> None:
    driver.delete_pod(NAMESPACE, name)


def test_a_claimed_gpu_reaches_the_container_and_is_released(driver: Driver) -> None:
    run_claim_pod(driver, "whole")
    claim_obj = allocated_claim(driver, "whole")
    [result] = claim_obj["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, driver.node.name)
    spec = spec_file(driver, claim_obj["metadata"]["uid"])
    assert spec.is_file()
    # what containerd did with the CDI spec, seen from inside the container
    log = driver.node.container_log(NAMESPACE, "whole", "main").splitlines()
    [visible] = [ln.split("=", 1)[1] for ln in log if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible in driver.uuids
    minor = driver.uuids.index(visible)
    chars = {ln.removeprefix("char:") for ln in log if ln.startswith("char:")}
    assert chars == {f"nvidia{minor}", "nvidiactl", "nvidia-uvm"}
    delete_pod(driver, "whole")
    # the kubelet unprepares the claim once its pod is gone: the driver removes the spec
    driver.wait(lambda: not spec.exists(), "the claim's CDI spec removed at Unprepare")


def test_a_kubelet_restart_wipes_the_slices_and_the_driver_repairs_them(driver: Driver) -> None:
    node = driver.node
    [before] = driver.slices()
    node.restart_kubelet()
    driver.wait(_registered(driver, 2), "the kubelet registered the driver again")

    def republished() -> bool:
        slices = driver.slices()
        return len(slices) == 1 and slices[0]["metadata"]["uid"] != before["metadata"]["uid"]

    driver.wait(republished, "the node's slice published again after the kubelet deleted it")
    run_claim_pod(driver, "after-restart")
    try:
        claim_obj = allocated_claim(driver, "after-restart")
        assert spec_file(driver, claim_obj["metadata"]["uid"]).is_file()
    finally:
        delete_pod(driver, "after-restart")


def release_claims(driver: Driver) -> None:
    """Delete the namespace's claims, whose pods are gone, once the kubelet unprepared them
    (their CDI specs gone: a pod placed before would find a device still prepared, and the
    kubelet retries it only a minute later). With no controller-manager here nothing
    deallocates them or lifts their delete protection, so the finalizers go by hand; the
    scheduler then counts their devices free again."""
    specs = driver.node.cdi_dir
    driver.wait(lambda: not list(specs.glob("k8s.gpuslice.io-claim_*")), "claims unprepared")
    kubectl = driver.node.plane.kubectl
    got = kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "name")
    assert got.returncode == 0, got.stderr
    for claim_name in got.stdout.split():
        patch = '{"metadata":{"finalizers":null}}'
        kubectl("patch", claim_name, "-n", NAMESPACE, "--type=merge", "-p", patch)
        kubectl("delete", claim_name, "-n", NAMESPACE, "--wait=false")
    driver.wait(
        lambda: not kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "name").stdout.strip(),
        "the earlier claims deleted",
    )


TWO_GPUS_SCRIPT = (
    "env | grep ^NVIDIA_VISIBLE_DEVICES=; "
    "for d in nvidia0 nvidia1; do [ -c /dev/$d ] && echo char:$d; done; "
    "for u in /var/run/nvidia-container-devices/*; do echo listed:${u##*/}; done; "
    "echo done; exec sleep 3600"
)


def test_a_pod_with_two_claims_sees_both_gpus(driver: Driver) -> None:
    """NVIDIA's two-claims manifest: the container gets both GPUs' device nodes and both in
    the toolkit's device list, though each claim's spec was written on its own."""
    release_claims(driver)
    for name in ("first", "second"):
        driver.node.create(claim(name))
    manifest = realnode.pod(
        "two-claims", NAMESPACE, TWO_GPUS_SCRIPT, claims={"a": "first", "b": "second"}
    )
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": driver.node.name}
    driver.run_pod(manifest, started=lambda log: "done" in log)
    log = driver.node.container_log(NAMESPACE, "two-claims", "main").splitlines()
    chars = {ln.removeprefix("char:") for ln in log if ln.startswith("char:")}
    assert chars == {"nvidia0", "nvidia1"}
    listed = {ln.removeprefix("listed:") for ln in log if ln.startswith("listed:")}
    assert listed == set(driver.uuids)
    [visible] = [ln.split("=", 1)[1] for ln in log if ln.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible in driver.uuids  # one claim's: an environment variable cannot add up
    delete_pod(driver, "two-claims")
