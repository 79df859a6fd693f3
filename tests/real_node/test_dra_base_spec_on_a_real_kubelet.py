"""The DRA driver with the driver's files on the node, under the real kubelet and containerd:
the agent writes its base CDI spec (`core.cdi.driver`), each device's IDs name it beside the
claim's, and a pod with two claims sees both GPUs with `NVIDIA_VISIBLE_DEVICES=void`, as with
NVIDIA's driver (its bats test "pod with two ResourceClaimTemplates gets two distinct GPUs").
containerd applies the base spec's library mounts and runs its hooks (a stand-in program)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from gpuslice.testing import realnode
from gpuslice.testing.driverroot import LIB_DIR, fake_driver_root, fake_hook
from gpuslice.testing.realnode import AgentProcess, RealNode, sim_uuids
from tests.real_node.test_dra_on_a_real_kubelet import (
    DRIVER,
    GPU_CLASS,
    NAMESPACE,
    SIM,
    Driver,
    _registered,
    _stand_in_devices,
    claim,
    release_claims,
)

pytestmark = pytest.mark.timeout(180)

VERSION = "550.54.15"  # the simulated node's driver


@pytest.fixture(scope="module")
def based(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    work = tmp_path_factory.mktemp("dra-base")
    driver_root = fake_driver_root(work / "driver-root", VERSION)
    shutil.rmtree(driver_root / "dev")  # character devices instead: containerd stats them
    _stand_in_devices(driver_root)
    hook = work / "toolkit" / "nvidia-cdi-hook"
    fake_hook(hook)
    hook.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n", encoding="utf-8")  # reads the state
    real_node.ensure_namespace(NAMESPACE)
    real_node.create(GPU_CLASS)
    agent = AgentProcess.start_dra(
        real_node,
        work,
        sim=SIM,
        driver=DRIVER,
        driver_root=driver_root,
        extra=("--memory-caps-hook-path", str(hook)),
    )
    running = Driver(agent.node, agent.proc, agent.log_path, sim_uuids(SIM))
    try:
        running.wait(lambda: len(running.slices()) == 1, "the node's slice published")
        running.wait(_registered(running, 1), "the kubelet registered the driver")
        yield running
    finally:
        running.stop(NAMESPACE)


SCRIPT = (
    "env | grep ^NVIDIA_VISIBLE_DEVICES=; "
    "for d in nvidia0 nvidia1 nvidiactl; do [ -c /dev/$d ] && echo char:$d; done; "
    f"[ -f /{LIB_DIR}/libcuda.so.{VERSION} ] && echo lib:libcuda; "
    "for u in /var/run/nvidia-container-devices/*; do [ -e $u ] && echo listed:${u##*/}; done; "
    "echo done; exec sleep 3600"
)


def test_a_pod_with_two_claims_sees_both_gpus_and_void(based: Driver) -> None:
    assert (based.node.cdi_dir / "k8s.gpuslice.io-device_base.yaml").is_file()
    release_claims(based)  # an earlier module's claims may still hold the GPUs
    for name in ("base-first", "base-second"):
        based.node.create(claim(name))
    manifest = realnode.pod(
        "base-two-claims", NAMESPACE, SCRIPT, claims={"a": "base-first", "b": "base-second"}
    )
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": based.node.name}
    based.run_pod(manifest, started=lambda log: "done" in log)
    log = based.node.container_log(NAMESPACE, "base-two-claims", "main").splitlines()
    chars = {ln.removeprefix("char:") for ln in log if ln.startswith("char:")}
    assert chars == {"nvidia0", "nvidia1", "nvidiactl"}
    assert "NVIDIA_VISIBLE_DEVICES=void" in log
    assert "lib:libcuda" in log  # the base spec's mount
    assert not [ln for ln in log if ln.startswith("listed:")]
    based.delete_pod(NAMESPACE, "base-two-claims")
    release_claims(based)  # the GPUs free again for the other modules' pods
