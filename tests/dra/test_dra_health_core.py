"""The pure device-health list the DRA health stream sends (core.dra.health).

The kubelet matches entries to allocated devices by pool and device name, so the names must
be the published ones, every published device must be there (one left out goes Unknown),
and a MIG device must follow its GPU's health as its taints do.
"""

from __future__ import annotations

from gpuslice.backends import open_backend
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.health import (
    MAX_HEALTH_MESSAGE_CHARS,
    DeviceHealthReport,
    device_health,
    health_message,
)
from gpuslice.core.dra.publish import dra_devices


def inventory(node: str) -> Inventory:
    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


def test_every_published_device_is_listed_healthy_under_the_node_pool() -> None:
    inv = inventory("sim:2xh100-80gb")
    reports = device_health(inv, frozenset(), {}, pool="n1")
    assert reports == (
        DeviceHealthReport("n1", "gpu-0", True, ""),
        DeviceHealthReport("n1", "gpu-1", True, ""),
    )


def test_an_xid_makes_only_its_gpu_unhealthy_with_the_code_in_the_message() -> None:
    inv = inventory("sim:2xh100-80gb")
    bad = inv.gpus[1].uuid
    reports = device_health(inv, {bad}, {bad: 79}, pool="n1")
    assert [(r.device, r.healthy) for r in reports] == [("gpu-0", True), ("gpu-1", False)]
    assert reports[1].message == f"XID 79 on {bad}"


def test_a_lost_gpu_and_an_unexplained_one_say_so() -> None:
    inv = inventory("sim:2xh100-80gb")
    lost, withdrawn = inv.gpus[0].uuid, inv.gpus[1].uuid
    reports = device_health(inv, {lost, withdrawn}, {lost: None}, pool="n1")
    assert reports[0].message == f"GPU {lost} lost"
    assert reports[1].message == f"{withdrawn} marked unhealthy by gpuslice"
    assert not reports[0].healthy
    assert not reports[1].healthy


def test_mig_devices_follow_their_gpu_and_their_own_uuid() -> None:
    inv = inventory("sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2")
    devices = dra_devices(inv)
    gpu = inv.gpus[0].uuid
    names = [d.name for d in devices]

    whole_gpu = device_health(inv, {gpu}, {gpu: 48}, pool="n1")
    assert [r.device for r in whole_gpu] == names
    assert all(not r.healthy and r.message == f"XID 48 on {gpu}" for r in whole_gpu)

    one = devices[2].uuid  # a MIG device withdrawn on its own: the XID is the GPU's
    single = device_health(inv, {one}, {gpu: 13}, pool="n1")
    assert [r.healthy for r in single] == [True, True, False, True]
    assert single[2].message == f"XID 13 on {gpu}"


def test_messages_are_cut_like_the_kubelet_cuts_them() -> None:
    assert health_message("x" * MAX_HEALTH_MESSAGE_CHARS) == "x" * MAX_HEALTH_MESSAGE_CHARS
    cut = health_message("y" * 5000)
    assert len(cut) == MAX_HEALTH_MESSAGE_CHARS
    assert cut.endswith("y...")
