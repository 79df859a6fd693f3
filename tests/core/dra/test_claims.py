"""What Prepare must do with an allocated claim (`core.dra.claims`), with no I/O: every
refusal names the claim's field and value; results group per config; shares are sized from
the allocation's consumed capacity; MPS daemons get NVIDIA's ID shape and checked limits."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.dra.claims import (
    ClaimError,
    claim_daemon_key,
    claim_work,
    group_daemon_spec,
    share_daemon_key,
    share_envs,
)
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import DraDevice, ShareOffer, dra_devices
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import SharingStrategy

DRIVER = "gpu.nvidia.com"
POOL = "n1"
REF = ClaimRef("ns", "uid-1", "c")
NVIDIA = "resource.nvidia.com/v1beta1"


def devices(node: str = "sim:2xh100-80gb") -> dict[str, DraDevice]:
    backend = open_backend(node)
    try:
        return {d.name: d for d in dra_devices(backend.inventory())}
    finally:
        backend.close()


def claim(results: list[Json], config: list[Json] | None = None,
          uid: str = "uid-1") -> Json:  # fmt: skip
    return {
        "metadata": {"uid": uid},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def result(device: str, request: str = "gpu", **extra: Any) -> Json:
    return {"request": request, "driver": DRIVER, "pool": POOL, "device": device, **extra}


def work(obj: Json, offers: dict[str, ShareOffer] | None = None) -> Any:
    return claim_work(obj, REF, driver=DRIVER, pool=POOL, devices=DEVICES, offers=offers or {})


DEVICES = devices()


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim([result("gpu-0")], uid="other"), "has UID 'other', not 'uid-1'"),
        ({"metadata": {"uid": "uid-1"}}, "status.allocation is missing"),
        ({"metadata": {"uid": "uid-1"}, "status": {"allocation": {"devices": {}}}},
         "results is missing"),
        (claim([dict(result("gpu-0"), driver="other.example.com")]), "no allocation result"),
        (claim([dict(result("gpu-0"), pool="n2")]), "results[0].pool is 'n2'"),
        (claim([result("gpu-9")]), "results[0].device 'gpu-9' is not a device of this node"),
        (claim([result("gpu-0"), result("gpu-0", "again")]), "allocates device 'gpu-0' a second"),
        (claim([result("gpu-0")], [{"source": "FromClaim", "opaque": {
            "driver": DRIVER, "parameters": {"apiVersion": NVIDIA, "kind": "Nope"}}}]),
         "unknown config kind 'Nope'"),
        ("not a claim", "not an object"),
    ],
)  # fmt: skip
def test_each_refusal_names_the_field_and_value(obj: Any, message: str) -> None:
    with pytest.raises(ClaimError) as err:
        work(obj)
    assert message in str(err.value)
    assert str(err.value).startswith("ResourceClaim ns/c")


def test_a_device_the_node_lacks_is_named_with_a_few_of_the_nodes() -> None:
    """Eight H100s in MIG mode hold 56 MIG devices: the refusal names eight and counts the
    rest instead of quoting every name."""
    many = devices("sim:8xh100-80gb/mig=1g.10gb*7")
    with pytest.raises(ClaimError) as err:
        claim_work(claim([result("gpu-9")]), REF, driver=DRIVER, pool=POOL, devices=many, offers={})
    text = str(err.value)
    assert text.endswith("and 48 more)")
    assert len(text) < 400


def test_results_group_per_config_and_requests_keep_their_main_name() -> None:
    mps = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    got = work(
        claim(
            [result("gpu-0", "a/fast"), result("gpu-1", "b")],
            [{"source": "FromClaim", "requests": ["a"],
              "opaque": {"driver": DRIVER, "parameters": mps}}],
        )
    )  # fmt: skip
    assert [d.request_name for d in got.devices] == ["a", "b"]
    assert [(g.sharing.strategy, len(g.devices)) for g in got.groups] == [("MPS", 1), (None, 1)]


def test_a_share_is_sized_from_consumed_capacity_and_refuses_a_claim_config() -> None:
    offer = {
        "gpu-0": ShareOffer(4, SharingStrategy.MPS, DEVICES["gpu-0"].capacity["memory"] // 2**20)
    }
    share = result("gpu-0", shareID="s-1", consumedCapacity={"memory": "20Gi", "shares": "2"})
    (dw,) = work(claim([share]), offer).devices
    assert dw.share is not None
    assert (dw.share.memory_mib, dw.share.shares, dw.share.thread_percentage) == (20480, 2, 50)
    assert share_envs(dw.share, 81559)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    mps = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": mps}}]
    with pytest.raises(ClaimError, match="offers as shares"):
        work(claim([share], config), offer)
    too_big = result("gpu-0", shareID="s-2", consumedCapacity={"memory": "900Gi"})
    with pytest.raises(ClaimError, match="does not fit device gpu-0"):
        work(claim([too_big]), offer)


@pytest.mark.parametrize(
    ("node_strategy", "interval", "notice"),
    [
        ("time-slicing", None, None),
        ("time-slicing", "Short", "asks for TimeSlicing (Short) on device gpu-0"),
        ("mps", None, "the node's mps sharing is kept"),
    ],
)
def test_a_claims_time_slicing_on_a_share_keeps_the_nodes_sharing_with_a_notice(
    node_strategy: Any, interval: str | None, notice: str | None
) -> None:
    """NVIDIA's driver applies a claim's TimeSlicing on any GPU: here the claim is prepared
    on the node's terms (no GPU-wide interval for one of several sharers) and told when
    they differ from what it asked."""
    offer = {"gpu-0": ShareOffer(4, node_strategy, 81559)}
    ts: Json = {"strategy": "TimeSlicing"}
    if interval is not None:
        ts["timeSlicingConfig"] = {"interval": interval}
    params = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": ts}
    config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
    got = work(claim([result("gpu-0", shareID="s-1")], config), offer)
    (dw,) = got.devices
    assert dw.share is not None
    assert dw.share.strategy == node_strategy
    assert (dw.sharing.strategy, dw.sharing.interval) == (None, None)
    if notice is None:
        assert got.notices == ()
    else:
        (message,) = got.notices
        assert notice in message
        assert message.startswith("ResourceClaim ns/c")


def test_time_sliced_share_hints_are_exact_at_the_default_size() -> None:
    offer = {"gpu-0": ShareOffer(4, SharingStrategy.TIME_SLICING, 81559)}
    share = result("gpu-0", shareID="s-1", consumedCapacity={"memory": f"{81559 // 4}Mi"})
    (dw,) = work(claim([share]), offer).devices
    assert dw.share is not None
    envs = share_envs(dw.share, 81559)
    assert (envs["GPUSLICE_GPU_FRACTION"], envs["GPUSLICE_MEMORY_LIMIT_MIB"]) == ("0.25", "20389")


def test_mps_group_daemon_has_nvidias_id_shape_and_checked_limit_keys() -> None:
    mps: Json = {
        "apiVersion": NVIDIA,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 30,
                "defaultPinnedDeviceMemoryLimit": "8Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "4Gi"},
            },
        },
    }
    config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": mps}}]
    (group,) = work(claim([result("gpu-0"), result("gpu-1", "g2")], config)).groups
    spec = group_daemon_spec("uid-1", group, "/plug/mps")
    assert spec is not None
    uuids = [DEVICES["gpu-0"].gpu.uuid, DEVICES["gpu-1"].gpu.uuid]
    assert spec.resource == claim_daemon_key("uid-1", uuids)
    assert spec.resource.startswith("uid-1-")
    assert len(spec.resource) == len("uid-1-") + 5
    assert spec.pipe_dir == f"/plug/mps/{spec.resource}/pipe"
    assert spec.commands == (
        "set_default_device_pinned_mem_limit 0 8192M",
        "set_default_device_pinned_mem_limit 1 4096M",
        "set_default_active_thread_percentage 30",
    )
    mps["sharing"]["mpsConfig"]["defaultPerDevicePinnedMemoryLimit"] = {"7": "4Gi"}
    (group,) = work(claim([result("gpu-0"), result("gpu-1", "g2")], config)).groups
    with pytest.raises(ClaimError, match="key '7' is neither a UUID"):
        group_daemon_spec("uid-1", group, "/plug/mps")


def test_share_daemon_keys_keep_the_socket_path_short() -> None:
    key = share_daemon_key("GPU-12345678-1234-1234-1234-123456789012")
    root = "/var/lib/kubelet/plugins/gpu.nvidia.com/mps"
    assert len(f"{root}/{key}/pipe/control".encode()) < 108
