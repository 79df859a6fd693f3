"""The real daemon on simulated MIG nodes, as the kubelet sees it.

A separate `gpuslice plugin` process registers with the kubelet emulator over unix sockets;
pods are admitted the kubelet's way (GetPreferredAllocation, then Allocate). The MIG UUIDs
a pod should get are read from the same simulated node in this process: the simulator's
UUIDs are stable, so both sides see the same devices.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuslice.core.devices import MigDevice
from gpuslice.emulator.admission import AdmissionError
from gpuslice.testing.daemon import DaemonProcess
from tests.core.sharing.mig_nodes import SEEDS, inventory
from tests.e2e.daemon_fixtures import STARTUP_S, running_daemon

WAIT_S = 10.0

MIXED_NODE = "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2"
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"
MIG_RESOURCES = {
    "nvidia.com/mig-3g.20gb": 1,
    "nvidia.com/mig-2g.10gb": 1,
    "nvidia.com/mig-1g.5gb": 2,
}


def _migs(spec: str, profile: str) -> list[MigDevice]:
    return [m for g in inventory(spec).gpus for m in g.mig_devices if m.profile == profile]


def _by_profile(spec: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for g in inventory(spec).gpus:
        for m in g.mig_devices:
            out.setdefault(f"nvidia.com/mig-{m.profile}", set()).add(m.uuid)
    return out


async def test_mixed_registers_one_plugin_per_profile_and_hands_out_mig_uuids(
    sock_dir: Path,
) -> None:
    async with running_daemon(
        sock_dir, MIXED, node=MIXED_NODE, expect="nvidia.com/mig-1g.5gb"
    ) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(
            lambda: all(kubelet.capacity(r) == n for r, n in MIG_RESOURCES.items()), WAIT_S
        )
        assert node.plugin_sockets() == {
            "nvidia-mig-3g.20gb.sock",
            "nvidia-mig-2g.10gb.sock",
            "nvidia-mig-1g.5gb.sock",
        }
        assert set(kubelet.resources()) == set(MIG_RESOURCES)
        assert kubelet.capacity("nvidia.com/gpu") == 0
        expected = _by_profile(MIXED_NODE)
        for resource in MIG_RESOURCES:
            assert set(kubelet.devices(resource)) == expected[resource]

        adm = await kubelet.admit(
            "default",
            "p0",
            [("c", {"nvidia.com/mig-3g.20gb": 1, "nvidia.com/mig-1g.5gb": 2})],
        )
        c = adm.container("c")
        big = c.for_resource("nvidia.com/mig-3g.20gb")
        small = c.for_resource("nvidia.com/mig-1g.5gb")
        assert big is not None
        assert small is not None
        assert big.response.env("NVIDIA_VISIBLE_DEVICES") == next(
            iter(expected["nvidia.com/mig-3g.20gb"])
        )
        visible = small.response.env("NVIDIA_VISIBLE_DEVICES")
        assert visible is not None
        assert sorted(visible.split(",")) == sorted(expected["nvidia.com/mig-1g.5gb"])
        assert visible.split(",") == list(small.device_ids)

        # Both 1g.5gb devices are taken now: a MIG device is never handed out twice.
        with pytest.raises(AdmissionError, match=r"unavailable for nvidia\.com/mig-1g\.5gb"):
            await kubelet.admit("default", "p1", [("c", {"nvidia.com/mig-1g.5gb": 1})])
        other = await kubelet.admit("default", "p2", [("c", {"nvidia.com/mig-2g.10gb": 1})])
        assert other.container("c").envs["NVIDIA_VISIBLE_DEVICES"] == next(
            iter(expected["nvidia.com/mig-2g.10gb"])
        )


@pytest.mark.parametrize(
    "flags",
    ["deviceIDStrategy: index", "deviceListStrategy: [cdi-cri]"],
)
async def test_mixed_allocate_per_device_strategy(sock_dir: Path, flags: str) -> None:
    config = MIXED + f"  plugin:\n    {flags}\n"
    small = _migs(MIXED_NODE, "1g.5gb")
    async with running_daemon(
        sock_dir, config, node=MIXED_NODE, expect="nvidia.com/mig-1g.5gb"
    ) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/mig-1g.5gb") == 2, WAIT_S)
        adm = await kubelet.admit("default", "p", [("c", {"nvidia.com/mig-1g.5gb": 2})])
        c = adm.container("c")
        by_uuid: dict[str, MigDevice] = {m.uuid: m for m in small}
        assert set(c.device_ids) == set(by_uuid)
        if flags.startswith("deviceIDStrategy"):
            # `<gpu>:<mig>`: the MIG devices' positions under GPU 0, in the order handed out.
            assert c.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(
                f"0:{by_uuid[i].index}" for i in c.device_ids
            )
            assert c.cdi_devices == ()
        else:
            assert c.cdi_devices == tuple(
                f"k8s.device-plugin.nvidia.com/gpu={i}" for i in c.device_ids
            )
            assert all(name.split("=", 1)[1].startswith("MIG-") for name in c.cdi_devices)
            assert "NVIDIA_VISIBLE_DEVICES" not in c.envs


SEED_001_NODE = "sim:1xa100-80gb/mig=1g.10gb*7"
SEED_001_SINGLE = (SEEDS / "001-a100-mig-single.yaml").read_text(encoding="utf-8")
MPS_ON_MIG = SEED_001_SINGLE + (
    "\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
)


async def test_seed_001_single_gives_each_pod_its_own_mig_device(sock_dir: Path) -> None:
    """Seed 001: `nvidia.com/gpu: 7`, and seven pods each print a different MIG UUID."""
    migs = {m.uuid for m in _migs(SEED_001_NODE, "1g.10gb")}
    async with running_daemon(sock_dir, SEED_001_SINGLE, node=SEED_001_NODE) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 7, WAIT_S)
        assert node.plugin_sockets() == {"nvidia-gpu.sock"}
        seen = []
        for i in range(7):
            adm = await kubelet.admit("default", f"stress-{i}", [("c", {"nvidia.com/gpu": 1})])
            seen.append(adm.container("c").envs["NVIDIA_VISIBLE_DEVICES"])
        assert sorted(seen) == sorted(migs)
        with pytest.raises(AdmissionError, match=r"Requested: 1, Available: 0"):
            await kubelet.admit("default", "stress-7", [("c", {"nvidia.com/gpu": 1})])

        # A reload that would put MPS on these MIG devices is refused; the devices stay.
        node.write_config(MPS_ON_MIG)
        await kubelet.wait_for(lambda: "config-rejected" in node.daemon.log(), WAIT_S)
        assert "sharing using MPS is not supported for MIG devices" in node.daemon.log()
        assert kubelet.capacity("nvidia.com/gpu") == 7


SEED_002_NODE = (
    "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2,1xa100-40gb/mig=7g.40gb,1xa100-40gb"
)


async def test_seed_002_fine_config_time_slices_mig_devices(sock_dir: Path) -> None:
    config = (SEEDS / "002-fine-a100-40gb.yaml").read_text(encoding="utf-8")
    small = {m.uuid for m in _migs(SEED_002_NODE, "1g.5gb")}
    counts = {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
        "nvidia.com/mig-7g.40gb": 7,
    }
    async with running_daemon(sock_dir, config, node=SEED_002_NODE) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(
            lambda: all(kubelet.capacity(r) == n for r, n in counts.items()), WAIT_S
        )
        ids = sorted(kubelet.devices("nvidia.com/mig-1g.5gb"))
        assert ids == sorted(f"{u}::{n}" for u in small for n in range(2))
        # Four pods share the two 1g.5gb devices; each sees a MIG UUID, never a replica ID.
        visible = []
        for i in range(4):
            adm = await kubelet.admit("default", f"p{i}", [("c", {"nvidia.com/mig-1g.5gb": 1})])
            visible.append(adm.container("c").envs["NVIDIA_VISIBLE_DEVICES"])
        assert set(visible) == small
        assert sorted(visible.count(u) for u in small) == [2, 2]


async def test_mps_on_mig_config_stops_the_daemon_at_start_with_the_reason(
    sock_dir: Path,
) -> None:
    config = sock_dir / "config.yaml"
    config.write_text(MPS_ON_MIG, encoding="utf-8")
    plugin_dir = sock_dir / "dp"
    plugin_dir.mkdir()
    daemon = DaemonProcess(
        [
            "--node",
            SEED_001_NODE,
            "--config-file",
            str(config),
            "--device-plugin-path",
            str(plugin_dir),
            "--no-compute-mode",
            "--no-labels",
            "--mps-control",
            f"{sys.executable} -m gpuslice.emulator.fake_mps_control",
        ],
        log_path=sock_dir / "daemon.log",
    )
    await daemon.start()
    try:
        code = await daemon.wait_exit(STARTUP_S)
    finally:
        await daemon.terminate()
    log = daemon.log()
    assert code == 2, log  # bad input: one message, exit code 2 (gpuslice.cli.main)
    assert "sharing using MPS is not supported for MIG devices" in log
    assert "Traceback" not in log
    assert {p.name for p in plugin_dir.iterdir() if p.is_socket()} == set()  # no socket left
