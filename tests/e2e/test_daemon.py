"""The daemon as the kubelet sees it: a separate `gpuslice plugin` process, real unix sockets.

Each test starts the real daemon on a simulated node (the GPU is the one thing simulated)
and plays the kubelet with the emulator: registration, ListAndWatch, Allocate per
device-list strategy, preferred allocation, refusals, kubelet restarts, XIDs, live reloads
and SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpuslice.emulator.admission import AdmissionError
from gpuslice.kubelet.rpc import DevicePluginClient, unix_target
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.eventually import eventually
from tests.e2e.daemon_fixtures import running_daemon

WAIT_S = 10.0

TS4 = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def _gpu_of(device_id: str) -> str:
    return device_id.partition("::")[0]


async def test_registers_and_advertises_replicas(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        assert kubelet.registrations["nvidia.com/gpu"] == 1
        options = kubelet.options("nvidia.com/gpu")
        assert options is not None
        assert options.get_preferred_allocation_available
        assert node.plugin_sockets() == {"nvidia-gpu.sock"}
        ids = sorted(kubelet.devices("nvidia.com/gpu"))
        assert len({_gpu_of(i) for i in ids}) == 2
        assert all(i.rsplit("::", 1)[1] in {"0", "1", "2", "3"} for i in ids)


@pytest.mark.parametrize(
    ("flags", "check"),
    [
        ("deviceListStrategy: envvar", "envvar"),
        ("deviceListStrategy: volume-mounts", "volume-mounts"),
        ("deviceListStrategy: cdi-annotations", "cdi-annotations"),
        ("deviceListStrategy: [cdi-cri]", "cdi-cri"),
        ("deviceIDStrategy: index", "index"),
    ],
)
async def test_allocate_for_each_device_list_strategy(
    sock_dir: Path, flags: str, check: str
) -> None:
    config = f"version: v1\nflags:\n  plugin:\n    {flags}\n    passDeviceSpecs: true\n"
    async with running_daemon(sock_dir, config) as node:
        admission = await node.kubelet.admit("default", "p0", [("c", {"nvidia.com/gpu": 1})])
        c = admission.containers[0]
        (uuid,) = c.device_ids
        assert uuid.startswith("GPU-")
        nodes = {d.container_path for d in c.devices}
        if check.startswith("cdi-"):
            assert nodes == set(), "CDI-only responses carry no device specs (the spec does)"
        else:
            assert nodes & {"/dev/nvidia0", "/dev/nvidia1"}, c.devices
        if check == "envvar":
            assert c.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
        elif check == "volume-mounts":
            assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
            assert [(m.host_path, m.container_path) for m in c.mounts] == [
                ("/dev/null", f"/var/run/nvidia-container-devices/{uuid}")
            ]
        elif check == "cdi-annotations":
            ((key, value),) = c.annotations.items()
            assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
            assert value == f"k8s.device-plugin.nvidia.com/gpu={uuid}"
            assert "NVIDIA_VISIBLE_DEVICES" not in c.envs
        elif check == "cdi-cri":
            assert c.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={uuid}",)
        else:
            assert c.envs["NVIDIA_VISIBLE_DEVICES"] in {"0", "1"}


async def test_preferred_allocation_spreads_replicas_over_gpus(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        gpus = []
        for i in range(4):
            adm = await kubelet.admit("default", f"p{i}", [("c", {"nvidia.com/gpu": 1})])
            gpus.append(_gpu_of(adm.containers[0].device_ids[0]))
        assert len(set(gpus)) == 2
        assert gpus.count(gpus[0]) == 2, gpus


async def test_packed_policy_fills_one_gpu_first(sock_dir: Path) -> None:
    config = TS4 + "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n"
    async with running_daemon(sock_dir, config) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        gpus = []
        for i in range(4):
            adm = await kubelet.admit("default", f"p{i}", [("c", {"nvidia.com/gpu": 1})])
            gpus.append(_gpu_of(adm.containers[0].device_ids[0]))
        assert len(set(gpus)) == 1, gpus


async def test_fail_requests_greater_than_one(sock_dir: Path) -> None:
    config = TS4.replace("    resources:", "    failRequestsGreaterThanOne: true\n    resources:")
    async with running_daemon(sock_dir, config) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        with pytest.raises(AdmissionError) as err:
            await kubelet.admit("default", "big", [("c", {"nvidia.com/gpu": 2})])
        text = str(err.value)
        assert 'invalid allocation request for "nvidia.com/gpu"' in text
        assert "maximum request size for shared resources is 1; found 2" in text
        # the daemon still serves a valid request afterwards
        adm = await kubelet.admit("default", "small", [("c", {"nvidia.com/gpu": 1})])
        assert len(adm.containers[0].device_ids) == 1


async def test_unknown_device_id_is_refused_and_daemon_keeps_serving(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        socket = node.plugin_dir / "nvidia-gpu.sock"
        async with grpc.aio.insecure_channel(unix_target(str(socket))) as channel:
            client = DevicePluginClient(channel)
            request = api.AllocateRequest(
                container_requests=[api.ContainerAllocateRequest(devices_ids=["GPU-nope::0"])]
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.allocate(request, timeout_s=WAIT_S)
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert "unknown device: GPU-nope::0" in (err.value.details() or "")
        adm = await node.kubelet.admit("default", "ok", [("c", {"nvidia.com/gpu": 1})])
        assert adm.containers[0].device_ids
        assert node.daemon.running


async def test_reregisters_after_each_of_20_kubelet_restarts(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        kubelet = node.kubelet
        for n in range(2, 22):
            await kubelet.restart()
            await kubelet.wait_for(
                lambda n=n: (
                    kubelet.registrations["nvidia.com/gpu"] >= n  # type: ignore[misc]
                    and kubelet.capacity("nvidia.com/gpu") == 8
                ),
                WAIT_S,
            )
        assert kubelet.registrations["nvidia.com/gpu"] == 21
        assert node.plugin_sockets() == {"nvidia-gpu.sock"}
        adm = await kubelet.admit("default", "after", [("c", {"nvidia.com/gpu": 1})])
        assert adm.containers[0].device_ids


async def test_xid_marks_every_replica_unhealthy_then_recovers(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        # XID 13 is an application error NVIDIA ignores by default; 79 (fallen off the bus)
        # is not. Events are applied in order, so once GPU 1 is unhealthy, GPU 0's XID 13
        # has been seen and ignored.
        node.control.inject_xid(0, 13)
        node.control.inject_xid(1, 79)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4, WAIT_S)
        health = kubelet.devices("nvidia.com/gpu")
        sick = {_gpu_of(i) for i, h in health.items() if h == "Unhealthy"}
        assert len(sick) == 1
        assert sum(1 for h in health.values() if h == "Unhealthy") == 4
        assert kubelet.capacity("nvidia.com/gpu") == 8
        node.control.inject_recovery(1)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8, WAIT_S)


UNWATCHED_NODE = """\
gpus:
- {model: t4, uuid: GPU-0e5c4d6a-0000-4000-8000-000000000000}
- {model: t4, uuid: GPU-0e5c4d6a-0000-4000-8000-000000000001, healthEvents: unmonitored}
- {model: t4, uuid: GPU-0e5c4d6a-0000-4000-8000-000000000002, healthEvents: unsupported}
"""


async def test_a_gpu_whose_health_events_cannot_be_registered_is_listed_unhealthy(
    sock_dir: Path,
) -> None:
    """As NVIDIA's device plugin: a GPU nobody watches for XIDs is not advertised healthy
    (one whose events NVML calls unsupported, too old, stays in service with a warning),
    and the log names the GPU."""
    node_file = sock_dir / "node.yaml"
    node_file.write_text(UNWATCHED_NODE, encoding="utf-8")
    unwatched = "GPU-0e5c4d6a-0000-4000-8000-000000000001"
    async with running_daemon(sock_dir, TS4, node=f"sim:{node_file}") as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 12, WAIT_S)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8, WAIT_S)
        health = kubelet.devices("nvidia.com/gpu")
        assert {_gpu_of(i) for i, h in health.items() if h == "Unhealthy"} == {unwatched}
        log = node.daemon.log()
        assert f"event=health-unmonitored gpu={unwatched}" in log
        assert "gpu=GPU-0e5c4d6a-0000-4000-8000-000000000002" in log


async def test_bad_config_is_refused_and_devices_stay(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        node.write_config(TS4.replace("replicas: 4", "replica: 2"))
        await kubelet.wait_for(lambda: "config-rejected" in node.daemon.log(), WAIT_S)
        assert "did you mean 'replicas'" in node.daemon.log()
        assert kubelet.capacity("nvidia.com/gpu") == 8
        node.write_config(TS4.replace("replicas: 4", "replicas: 2"))
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)


async def test_sigterm_removes_sockets_and_exits_cleanly(sock_dir: Path) -> None:
    async with running_daemon(sock_dir, TS4) as node:
        assert node.plugin_sockets() == {"nvidia-gpu.sock"}
        code = await node.daemon.terminate()
        assert code == 0, node.daemon.log()
        assert node.plugin_sockets() == set()
        assert "event=stopped" in node.daemon.log()


async def test_init_failure_exits_2_or_waits_when_fail_on_init_error_is_false(
    sock_dir: Path,
) -> None:
    base = ["--node", "sim:2xnot-a-gpu", "--device-plugin-path", str(sock_dir), "--no-labels"]
    failing = DaemonProcess(base, log_path=sock_dir / "fail.log")
    await failing.start()
    assert await failing.wait_exit(30) == 2
    assert "unknown GPU model 'not-a-gpu'; known models: a100-40gb" in failing.log()
    assert "Traceback" not in failing.log()

    waiting = DaemonProcess([*base, "--no-fail-on-init-error"], log_path=sock_dir / "wait.log")
    await waiting.start()
    await eventually(
        lambda: "event=init-failed" in waiting.log(),
        "the init-failed event",
        timeout=30,
        explain=waiting.log,
        give_up=lambda: not waiting.running,
    )
    assert await waiting.terminate() == 0


async def test_imex_channels_follow_nvidia_imex_go(sock_dir: Path) -> None:
    """NVIDIA `internal/imex/imex.go` and `internal/plugin/server.go`: with `required: true`
    and no channel device the plugin refuses to start; with the channel, Allocate adds
    NVIDIA_IMEX_CHANNELS and the channel's device spec."""
    dev_root = sock_dir / "devroot"
    imex = "imex:\n  channelIDs: [0]\n  required: true\n"
    config = (
        f"version: v1\nflags:\n  nvidiaDevRoot: {dev_root}\n  plugin:\n"
        f"    containerDriverRoot: {dev_root}\n    passDeviceSpecs: true\n{imex}"
    )
    path = sock_dir / "imex.yaml"
    path.write_text(config, encoding="utf-8")
    args = ["--node", "sim:1xh100-80gb", "--config-file", str(path), "--no-labels"]
    refused = DaemonProcess(
        [*args, "--device-plugin-path", str(sock_dir)], log_path=sock_dir / "imex.log"
    )
    await refused.start()
    assert await refused.wait_exit(30) == 2
    assert "IMEX channel 0 does not exist" in refused.log()

    channel = dev_root / "dev/nvidia-caps-imex-channels/channel0"
    channel.parent.mkdir(parents=True)
    channel.symlink_to("/dev/null")  # a character device, as the real channel is
    (sock_dir / "up").mkdir()
    async with running_daemon(sock_dir / "up", config, node="sim:1xh100-80gb") as node:
        admission = await node.kubelet.admit("default", "p0", [("c", {"nvidia.com/gpu": 1})])
        c = admission.containers[0]
        assert c.envs["NVIDIA_IMEX_CHANNELS"] == "0"
        specs = {d.container_path: d.host_path for d in c.devices}
        assert specs["/dev/nvidia-caps-imex-channels/channel0"] == str(channel)
