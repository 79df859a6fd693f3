"""`gpuslice plugin --dra` as a process: registration through the plugin watcher, slices
published and updated on health change, claims prepared with the right CDI edits for
exclusive, time-sliced, MPS and MIG claims, unprepare, and restarts of both sides."""

from __future__ import annotations

import ctypes
import os
import uuid
from pathlib import Path

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.testing.apiserver import FakeApiServer
from tests.e2e_dra.dra_node import (
    DRIVER,
    NODE,
    DraNode,
    claim_obj,
    opaque,
    request,
    running_dra_node,
)

NVIDIA = "resource.nvidia.com/v1beta1"
MS_BIND, MS_SHARED, MNT_DETACH = 0x1000, 0x100000, 0x2
MIG_NODE = "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2"


def _device_edits(spec: Json, device: str) -> Json:
    entry = next(d for d in spec["devices"] if d["name"].endswith(f"-{device}"))
    edits: Json = entry["containerEdits"]
    return edits


def _env(spec: Json, device: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in _device_edits(spec, device)["env"])


def _is_dir(path: Path) -> bool:
    return path.is_dir()


def _read_all(directory: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in directory.glob("*") if p.is_file())


def _uuid(node: DraNode, device: str) -> str:
    return str(node.devices()[device]["attributes"]["uuid"]["string"])


async def test_device_nodes_under_a_driver_containers_root_get_their_host_path(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """NVIDIA's getDevRoot: a driver root seen in the agent's container that holds `dev/`
    is the dev root, so each device node's hostPath is under the host's driver root while
    its path is what the container sees; a runtime would otherwise stat /dev/nvidiactl."""
    seen = sock_dir / "driver-root"
    (seen / "dev").mkdir(parents=True)
    (seen / "dev" / "nvidiactl").write_text("")
    args = ["--nvidia-driver-root", "/run/nvidia/driver", "--container-driver-root", str(seen)]
    async with running_dra_node(sock_dir, api, args=args) as node:
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        assert (await node.prepare(ref))[ref.uid].error == ""
        spec = node.cdi_spec(ref.uid)
        assert spec["cdiVersion"] == "0.5.0"  # hostPath came with CDI 0.5.0
        assert _device_edits(spec, "gpu-0")["deviceNodes"] == [
            {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}
        ]
        assert spec["containerEdits"]["deviceNodes"] == [
            {"path": f"/dev/{n}", "hostPath": f"/run/nvidia/driver/dev/{n}"}
            for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
        ]
        assert await node.unprepare(ref) == {ref.uid: ""}


async def test_exclusive_claim_prepared_idempotently_then_unprepared(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api) as node:
        assert list(node.devices()) == ["gpu-0"]
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        result = (await node.prepare(ref))[ref.uid]
        assert result.error == ""
        (device,) = result.devices
        assert (device.pool, device.device, device.request_names) == (NODE, "gpu-0", ("gpu",))
        assert device.cdi_ids == (f"k8s.gpuslice.io/claim={ref.uid}-gpu-0",)
        spec = node.cdi_spec(ref.uid)
        assert spec["kind"] == "k8s.gpuslice.io/claim"
        assert _env(spec, "gpu-0")["NVIDIA_VISIBLE_DEVICES"] == _uuid(node, "gpu-0")
        assert _device_edits(spec, "gpu-0")["deviceNodes"] == [{"path": "/dev/nvidia0"}]
        # the kubelet asks again (its restart): same answer, nothing redone
        assert (await node.prepare(ref))[ref.uid] == result
        assert await node.unprepare(ref) == {ref.uid: ""}
        assert not (node.cdi_root / f"k8s.gpuslice.io-claim_{ref.uid}.yaml").exists()
        assert await node.unprepare(ref) == {ref.uid: ""}  # idempotent


async def test_nvidia_mps_config_gets_its_own_daemon_and_mounts(
    sock_dir: Path, api: FakeApiServer
) -> None:
    params = {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
            },
        },
    }
    async with running_dra_node(sock_dir, api) as node:
        claim = claim_obj("mps", [request("mps-gpu")], [opaque(params, ["mps-gpu"])])
        ref = node.allocate(claim, devices={"mps-gpu": "gpu-0"})
        result = (await node.prepare(ref))[ref.uid]
        assert result.error == "", result.error
        edits = _device_edits(node.cdi_spec(ref.uid), "gpu-0")
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        pipe = Path(mounts["/tmp/nvidia-mps"])
        assert _is_dir(pipe)
        assert _is_dir(Path(mounts["/dev/shm"]))
        assert pipe.parent.name.startswith(ref.uid)
        assert pipe.is_relative_to(node.plugin_dir / "mps")
        # the fake control daemon logs the defaults it was given
        commands = _read_all(pipe.parent / "log")
        assert "set_default_active_thread_percentage 50" in commands
        assert "set_default_device_pinned_mem_limit 0 10240M" in commands
        assert await node.unprepare(ref) == {ref.uid: ""}
        await node.wait(lambda: not pipe.parent.joinpath(".started").exists(), "daemon stopped")


async def test_time_slicing_interval_is_set_then_reset(sock_dir: Path, api: FakeApiServer) -> None:
    params = {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    async with running_dra_node(sock_dir, api) as node:
        uuid = _uuid(node, "gpu-0")
        ref = node.allocate(
            claim_obj("ts", [request("gpu")], [opaque(params)]), devices={"gpu": "gpu-0"}
        )
        assert (await node.prepare(ref))[ref.uid].error == ""
        assert node.nvidia_smi_calls() == [f"compute-policy -i {uuid} --set-timeslice 3"]
        assert _env(node.cdi_spec(ref.uid), "gpu-0")["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert await node.unprepare(ref) == {ref.uid: ""}
        assert node.nvidia_smi_calls()[-1] == f"compute-policy -i {uuid} --set-timeslice 0"


async def test_a_gpu_without_timeslice_support_fails_that_claim_plainly(
    sock_dir: Path, api: FakeApiServer
) -> None:
    params = {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
    }
    async with running_dra_node(sock_dir, api, nvidia_smi_fail="Not Supported") as node:
        bad = node.allocate(
            claim_obj("ts", [request("gpu")], [opaque(params)]), devices={"gpu": "gpu-0"}
        )
        error = (await node.prepare(bad))[bad.uid].error
        assert "does not take time-slice interval 1" in error
        assert "Not Supported" in error
        assert not (node.cdi_root / f"k8s.gpuslice.io-claim_{bad.uid}.yaml").exists()
        # nothing was left prepared: the same device serves the next claim
        plain = node.allocate(claim_obj("plain", [request("gpu")]), devices={"gpu": "gpu-0"})
        assert (await node.prepare(plain))[plain.uid].error == ""


async def test_mig_devices_are_published_and_prepared_with_their_own_uuid(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api, node=MIG_NODE) as node:
        devices = node.devices()
        assert all(d["attributes"]["type"] == {"string": "mig"} for d in devices.values())
        name = "gpu-0-mig-1g5gb-19-0"
        ref = node.allocate(
            claim_obj("mig", [request("mig", "mig.nvidia.com")]), devices={"mig": name}
        )
        assert (await node.prepare(ref))[ref.uid].error == ""
        env = _env(node.cdi_spec(ref.uid), name)
        assert env["NVIDIA_VISIBLE_DEVICES"] == _uuid(node, name)
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        mps = {
            "apiVersion": NVIDIA,
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS"},
        }
        other = node.allocate(
            claim_obj("mig-mps", [request("mig", "mig.nvidia.com")], [opaque(mps)]),
            devices={"mig": "gpu-0-mig-2g10gb-14-2"},
        )
        # MPS on a MIG device: NVIDIA's driver runs it, so does gpuslice (its own daemon,
        # tests/e2e_dra/test_dra_mps_on_mig.py)
        assert (await node.prepare(other))[other.uid].error == ""
        assert await node.unprepare(other) == {other.uid: ""}
        # the device plugin's migStrategy does not apply to DRA: no advice about it
        assert "migStrategy" not in node.log()


async def test_bad_claims_get_their_own_error_and_disturb_nothing(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        good = node.allocate(claim_obj("good", [request("gpu")]), devices={"gpu": "gpu-0"})
        unknown_kind = node.allocate(
            claim_obj(
                "unknown-kind",
                [request("gpu")],
                [opaque({"apiVersion": NVIDIA, "kind": "GpuConfg"})],
            ),
            devices={"gpu": "gpu-1"},
        )
        typo = node.allocate(
            claim_obj(
                "typo",
                [request("gpu")],
                [opaque({"apiVersion": NVIDIA, "kind": "GpuConfig", "sharng": {}})],
            ),
            devices={"gpu": "gpu-1"},
        )
        other_driver = node.allocate(
            claim_obj(
                "other-driver",
                [request("gpu")],
                [opaque({"whatever": True}, driver="gpu.example.com")],
            ),
            devices={"gpu": "gpu-1"},
        )
        gone = node.allocate(claim_obj("gone", [request("gpu")]), devices={"gpu": "gpu-7"})
        results = await node.prepare(good, unknown_kind, typo, gone)
        assert results[good.uid].error == ""
        assert "unknown config kind 'GpuConfg'" in results[unknown_kind.uid].error
        assert "sharng" in results[typo.uid].error
        assert "device 'gpu-7' is not a device of this node" in results[gone.uid].error
        # a config for another driver is not ours to read: the claim prepares
        assert (await node.prepare(other_driver))[other_driver.uid].error == ""
        # the same device twice: the second claim is refused, naming the first
        twice = node.allocate(claim_obj("twice", [request("gpu")]), devices={"gpu": "gpu-0"})
        assert "already prepared for ResourceClaim default/good" in (
            (await node.prepare(twice))[twice.uid].error
        )
        # a claim replaced under the same name, and one not allocated at all
        other_uid, missing_uid = str(uuid.uuid4()), str(uuid.uuid4())
        stale = good.__class__(good.namespace, other_uid, good.name)
        assert "deleted and created again" in (await node.prepare(stale))[other_uid].error
        api.add_claim(claim_obj("pending", [request("gpu")]))
        pending = api.claim("default", "pending")["metadata"]["uid"]
        ref = good.__class__("default", pending, "pending")
        assert "not allocated" in (await node.prepare(ref))[pending].error
        missing = good.__class__("default", missing_uid, "no-such-claim")
        assert "not found" in (await node.prepare(missing))[missing_uid].error
        assert node.daemon.running
        assert (await node.prepare(good))[good.uid].error == ""


async def test_health_change_taints_the_device_then_clears(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        node.control.inject_xid(1, 79)
        await node.wait(lambda: "taints" in node.devices()["gpu-1"], "gpu-1 tainted")
        (taint,) = node.devices()["gpu-1"]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            f"{DRIVER}/xid",
            "79",
            "NoSchedule",
        )
        assert "taints" not in node.devices()["gpu-0"]
        generation = node.slices()[0]["spec"]["pool"]["generation"]
        node.control.inject_recovery(1)
        await node.wait(lambda: "taints" not in node.devices()["gpu-1"], "gpu-1 healthy")
        assert node.slices()[0]["spec"]["pool"]["generation"] > generation


async def test_an_ignored_xid_is_an_informational_taint_until_recovery(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """NVIDIA's DRA driver: an XID it ignores (43, application-caused) taints the device
    with the same `xid` key and effect `None`: seen, still allocatable. A counted XID on
    the same GPU takes the key over with `NoSchedule`; recovery clears both."""
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        node.control.inject_xid(0, 43)
        await node.wait(lambda: "taints" in node.devices()["gpu-0"], "gpu-0 noticed")
        (taint,) = node.devices()["gpu-0"]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (f"{DRIVER}/xid", "43", "None")
        assert "taints" not in node.devices()["gpu-1"]
        node.control.inject_xid(0, 79)
        await node.wait(
            lambda: node.devices()["gpu-0"]["taints"][0]["effect"] == "NoSchedule", "79 wins"
        )
        (taint,) = node.devices()["gpu-0"]["taints"]
        assert (taint["key"], taint["value"]) == (f"{DRIVER}/xid", "79")
        node.control.inject_xid(0, 43)  # an ignored XID does not hide why it is unhealthy
        await node.wait(lambda: node.daemon.log().count("health-ignored") >= 2, "43 again")
        # a republish for another reason (a cordon of GPU 1) still shows why GPU 0 is out
        api.set_node_annotation(NODE, "gpuslice.io/gpu-cordon", "1")
        await node.wait(lambda: "taints" in node.devices()["gpu-1"], "gpu-1 cordoned")
        assert node.devices()["gpu-0"]["taints"][0]["value"] == "79"
        node.control.inject_recovery(0)
        await node.wait(lambda: "taints" not in node.devices()["gpu-0"], "gpu-0 recovered")


async def test_a_gpu_cordoned_by_annotation_is_tainted_until_lifted(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """`gpuslice.io/gpu-cordon` on the Node (read through the agent's Node watch): the named
    GPU's device is tainted `gpuslice.io/gpu-cordon:NoSchedule`, the others untouched; an
    entry naming nothing is skipped; removing the annotation lifts the taint."""
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        uuid = _uuid(node, "gpu-1")
        api.set_node_annotation(NODE, "gpuslice.io/gpu-cordon", f"{uuid},gpu-7")
        await node.wait(lambda: "taints" in node.devices()["gpu-1"], "gpu-1 cordoned")
        (taint,) = node.devices()["gpu-1"]["taints"]
        assert (taint["key"], taint["effect"]) == ("gpuslice.io/gpu-cordon", "NoSchedule")
        assert "value" not in taint
        assert "taints" not in node.devices()["gpu-0"]
        assert len(node.devices()) == 2  # cordoned, not withdrawn
        api.set_node_annotation(NODE, "gpuslice.io/gpu-cordon", None)
        await node.wait(lambda: "taints" not in node.devices()["gpu-1"], "cordon lifted")
        assert node.daemon.running


async def test_kubelet_restart_wipes_slices_they_come_back_and_prepare_repeats(
    sock_dir: Path, api: FakeApiServer
) -> None:
    async with running_dra_node(sock_dir, api) as node:
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        first = (await node.prepare(ref))[ref.uid]
        await node.kubelet.restart()
        assert api.delete_all_slices(NODE) == 1  # what a starting kubelet does
        await node.kubelet.wait_registered(DRIVER)
        await node.wait(lambda: bool(node.slices()), "slices republished")
        assert (await node.prepare(ref))[ref.uid] == first


async def test_daemon_restart_keeps_prepared_claims(sock_dir: Path, api: FakeApiServer) -> None:
    params = {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}},
    }
    async with running_dra_node(sock_dir, api) as node:
        ref = node.allocate(
            claim_obj("c1", [request("gpu")], [opaque(params)]), devices={"gpu": "gpu-0"}
        )
        first = (await node.prepare(ref))[ref.uid]
        calls = len(node.nvidia_smi_calls())
        await node.restart_daemon()
        await node.kubelet.wait_registered(DRIVER, 30.0)
        assert (await node.prepare(ref))[ref.uid] == first
        assert len(node.nvidia_smi_calls()) == calls  # not applied a second time
        # the claim is gone from the API by now; Unprepare works from the checkpoint
        api.delete_claim("default", "c1")
        assert await node.unprepare(ref) == {ref.uid: ""}
        assert node.nvidia_smi_calls()[-1].endswith("--set-timeslice 0")


async def test_a_v1beta1_kubelet_prepares_too(sock_dir: Path, api: FakeApiServer) -> None:
    async with running_dra_node(sock_dir, api, kubelet_versions=("v1beta1.DRAPlugin",)) as node:
        registration = node.kubelet.registration(DRIVER)
        assert registration is not None
        assert registration.version == "v1beta1.DRAPlugin"
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        (device,) = (await node.prepare(ref))[ref.uid].devices
        assert device.device == "gpu-0"


async def test_claims_mps_daemon_outlives_a_daemon_restart(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """The agent's upgrade must not cut the MPS clients of running pods: the daemon is left
    running and the next agent takes it over; it stops when the claim is unprepared."""
    params = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    async with running_dra_node(sock_dir, api) as node:
        ref = node.allocate(
            claim_obj("mps", [request("gpu")], [opaque(params)]), devices={"gpu": "gpu-0"}
        )
        first = (await node.prepare(ref))[ref.uid]
        assert first.error == ""
        edits = _device_edits(node.cdi_spec(ref.uid), "gpu-0")
        pipe = Path(
            next(m["hostPath"] for m in edits["mounts"] if "nvidia-mps" in m["containerPath"])
        )
        pid = _read_all_pid(pipe)
        await node.restart_daemon()
        await node.kubelet.wait_registered(DRIVER, 30.0)
        assert _read_all_pid(pipe) == pid
        assert _alive(pid)
        assert (await node.prepare(ref))[ref.uid] == first
        await node.wait(lambda: "event=mps-daemon-taken-over" in node.log(), "take-over")
        assert await node.unprepare(ref) == {ref.uid: ""}
        await node.wait(lambda: not _alive(pid), "the claim's daemon stopped")


def _read_all_pid(pipe: Path) -> int:
    return int((pipe / "nvidia-cuda-mps-control.pid").read_text().strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_nvidias_checkpoint_in_the_plugin_dir_is_left_alone(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """A node moving from NVIDIA's DRA driver (same driver name, same plugin directory)."""
    nvidia = '{"checksum": 1, "v1": {"preparedClaims": {}}}'
    async with running_dra_node(sock_dir, api, plugin_files={"checkpoint.json": nvidia}) as node:
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        assert (await node.prepare(ref))[ref.uid].error == ""
        assert (node.plugin_dir / "checkpoint.json").read_text() == nvidia
        assert (node.plugin_dir / "gpuslice-checkpoint.json").is_file()
        assert "dra-checkpoint-corrupt" not in node.log()


async def test_an_upgrade_from_a_build_that_kept_checkpoint_json_loses_no_claim(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """Builds before the rename kept the record as `checkpoint.json`: the next agent reads
    it (the API unreachable or not), keeps the claim's CDI spec and takes its MPS daemon
    over, instead of reading "no record" as "nothing prepared"."""
    params = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    async with running_dra_node(sock_dir, api) as node:
        ref = node.allocate(
            claim_obj("mps", [request("gpu")], [opaque(params)]), devices={"gpu": "gpu-0"}
        )
        first = (await node.prepare(ref))[ref.uid]
        assert first.error == ""
        edits = _device_edits(node.cdi_spec(ref.uid), "gpu-0")
        pipe = Path(
            next(m["hostPath"] for m in edits["mounts"] if "nvidia-mps" in m["containerPath"])
        )
        pid = _read_all_pid(pipe)
        assert await node.daemon.terminate() == 0, node.daemon.log()
        (node.plugin_dir / "gpuslice-checkpoint.json").rename(node.plugin_dir / "checkpoint.json")
        await node.daemon.start()
        await node.kubelet.wait_registered(DRIVER, 30.0)
        await node.wait(lambda: "dra-checkpoint-loaded" in node.log(), "the record loaded")
        assert "dra-cdi-orphan-removed" not in node.log()
        assert "dra-checkpoint-migrated" in node.log()
        assert (await node.prepare(ref))[ref.uid] == first
        await node.wait(lambda: "event=mps-daemon-taken-over" in node.log(), "take-over")
        assert _read_all_pid(pipe) == pid
        assert _alive(pid)
        assert (node.plugin_dir / "checkpoint.json").is_file(), "left for a rollback"
        assert await node.unprepare(ref) == {ref.uid: ""}
        await node.wait(lambda: not _alive(pid), "the claim's daemon stopped")


SHARED_BY_TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


async def test_a_claims_warning_is_an_event_about_the_claim_in_its_namespace(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """What Prepare did not apply (NVIDIA's TimeSlicing interval on a GPU this node offers
    as shares) is told where the claim's author looks, as the kubelet and the scheduler
    post about a pod: a Warning Event about the ResourceClaim, in its namespace
    (`kubectl events -n team-a --for resourceclaim/ts`), not one about the agent's pod."""
    async with running_dra_node(sock_dir, api, config=SHARED_BY_TIME_SLICING) as node:
        params = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {
            "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}  # fmt: skip
        claim = claim_obj("ts", [request("gpu")], [opaque(params)])
        claim["metadata"]["namespace"] = "team-a"
        ref = node.allocate(claim)
        assert (await node.prepare(ref))[ref.uid].error == ""
        [event] = [e for e in api.events("team-a") if e["reason"] == "ClaimConfigNotApplied"]
        involved = event["involvedObject"]
        assert (involved["kind"], involved["apiVersion"]) == ("ResourceClaim", "resource.k8s.io/v1")
        assert (involved["namespace"], involved["name"], involved["uid"]) == (
            "team-a",
            "ts",
            ref.uid,
        )
        assert event["type"] == "Warning"
        assert "TimeSlicing (Long)" in event["message"]
        assert event["metadata"]["namespace"] == "team-a"


def _tmpfs_on(directory: Path) -> bool:
    path = os.path.realpath(directory)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        if head.split()[4] == path and tail.split()[0] == "tmpfs":
            return True
    return False


async def test_an_mps_claims_shm_is_a_tmpfs_until_unprepare(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """As NVIDIA's driver: the claim's shm directory (the pods' `/dev/shm`) is a tmpfs while
    its daemon runs, so a tenant's writes are bounded memory, not the node's disk; it is
    unmounted at Unprepare and the directory removed. The work directory is made a shared
    mount first, as the chart's `mountPropagation: Bidirectional` makes the plugin
    directory, so the agent sees its mount would reach the runtime."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(str(sock_dir).encode(), str(sock_dir).encode(), None, MS_BIND, None) != 0:
        pytest.skip(f"cannot bind-mount here: {os.strerror(ctypes.get_errno())}")
    try:
        assert libc.mount(None, str(sock_dir).encode(), None, MS_SHARED, None) == 0
        params = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
        async with running_dra_node(sock_dir, api, env={"MPS_SHM_TMPFS": "true"}) as node:
            ref = node.allocate(
                claim_obj("mps", [request("gpu")], [opaque(params)]), devices={"gpu": "gpu-0"}
            )
            assert (await node.prepare(ref))[ref.uid].error == ""
            mounts = {m["containerPath"]: m["hostPath"] for m in
                      _device_edits(node.cdi_spec(ref.uid), "gpu-0")["mounts"]}  # fmt: skip
            shm = Path(mounts["/dev/shm"])
            assert _tmpfs_on(shm), node.log()
            assert await node.unprepare(ref) == {ref.uid: ""}
            await node.wait(lambda: not shm.exists(), "the claim's MPS directory removed")
            assert not _tmpfs_on(shm)
    finally:
        libc.umount2(str(sock_dir).encode(), MNT_DETACH)
