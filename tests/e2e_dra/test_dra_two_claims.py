"""One container with two claims sees both GPUs, as with NVIDIA's DRA driver (its bats test
"pod with two ResourceClaimTemplates gets two distinct GPUs"): a real `gpuslice plugin
--dra` with a driver root on disk, prepared through the kubelet emulator's gRPC, and the
CDI IDs applied as the runtime applies them (`testing.cdirun`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuslice.core.cdi.driver import BASE_ID
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.jsontypes import Json
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.cdirun import Container, inject
from gpuslice.testing.driverroot import LIB_DIR, fake_driver_root, fake_hook
from tests.e2e_dra.dra_node import DRIVER, DraNode, claim_obj, request, running_dra_node

VERSION = "550.54.15"  # the simulated node's driver
HOST_ROOT = "/run/nvidia/driver"


def _container(node: DraNode, refs: list[ClaimRef], results: dict[str, PrepareResult]) -> Container:
    """What the runtime gives one container holding `refs`, from the specs on disk."""
    ids = [i for ref in refs for d in results[ref.uid].devices for i in d.cdi_ids]
    specs: list[Json] = [
        yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(node.cdi_root.glob("*.yaml"))
    ]
    return inject(specs, ids)


def _gpus(container: Container) -> set[str]:
    return {p for p in container.device_nodes if p.removeprefix("/dev/nvidia").isdigit()}


async def test_a_container_with_two_claims_sees_both_gpus(
    sock_dir: Path, api: FakeApiServer
) -> None:
    root = fake_driver_root(sock_dir / "drv", VERSION)
    hook = fake_hook(sock_dir / "toolkit" / "nvidia-cdi-hook")
    args = [
        "--container-driver-root", str(root),
        "--nvidia-driver-root", HOST_ROOT,
        "--memory-caps-hook-path", str(hook),
    ]  # fmt: skip
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb", args=args) as node:
        refs = [node.allocate(claim_obj(n, [request("gpu")])) for n in ("first", "second")]
        results = await node.prepare(*refs)
        assert all(not r.error for r in results.values()), results
        for result in results.values():
            assert [d.cdi_ids[0] for d in result.devices] == [BASE_ID]

        seen = _container(node, refs, results)
        assert _gpus(seen) == {"/dev/nvidia0", "/dev/nvidia1"}
        assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "void"
        lib = f"/{LIB_DIR}/libcuda.so.{VERSION}"
        assert [m["hostPath"] for m in seen.mounts if m["containerPath"] == lib] == [
            f"{HOST_ROOT}{lib}"
        ]
        assert "event=dra-cdi-base-written" in node.log()

        # a restart keeps the base spec's name: the prepared claims' IDs still resolve
        await node.restart_daemon()
        await node.wait(lambda: node.log().count("dra-checkpoint-loaded") == 2, "reloaded")
        await node.kubelet.wait_registered(DRIVER, 30.0)  # before the Unprepare below
        again = _container(node, refs, results)
        assert _gpus(again) == _gpus(seen)
        assert again.env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert await node.unprepare(*refs) == {r.uid: "" for r in refs}
        assert [p.name for p in node.cdi_root.glob("*.yaml")] == [
            "k8s.gpuslice.io-device_base.yaml"
        ]


async def test_without_the_drivers_files_claims_name_their_gpus_and_one_warning_says_so(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        refs = [node.allocate(claim_obj(n, [request("gpu")])) for n in ("first", "second")]
        results = await node.prepare(*refs)
        assert all(len(d.cdi_ids) == 1 for r in results.values() for d in r.devices)
        seen = _container(node, refs, results)
        assert _gpus(seen) == {"/dev/nvidia0", "/dev/nvidia1"}
        visible = seen.env["NVIDIA_VISIBLE_DEVICES"]
        assert visible.startswith("GPU-")
        assert "," not in visible  # the last claim's only
        log = node.log()
        assert log.count("event=dra-cdi-base-missing") == 1, log
        assert "libcuda.so.550.54.15" in log
        assert not list(node.cdi_root.glob("k8s.gpuslice.io-device_*"))
