"""Consumable shares in NVIDIA's modes (`--consumable-shares` memory, unlimited, N) beside
gpuslice's replicas-derived shares, and `cores` (a percentage of the SMs) on every offered
device: what is published, and what a claim gets from what the scheduler recorded. Pure:
the simulated node's inventory and plan, no I/O."""

from __future__ import annotations

import re

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.devices import Inventory
from gpuslice.core.dra.claims import ClaimError, ShareUse, claim_work, share_envs
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.publish import (
    CORES_CAPACITY,
    REPLICAS,
    SHARES_CAPACITY,
    ShareOffer,
    SharesMode,
    device_json,
    dra_devices,
)
from gpuslice.core.jsontypes import Json
from gpuslice.core.policy import share_offers
from gpuslice.core.sharing.model import Plan, SharingStrategy
from gpuslice.core.sharing.plan import build_plan
from gpuslice.core.units import MIB, quantity_mib
from gpuslice.whatif.claims import slice_devices
from tests.core.dra.share_claims import unrecorded_share

DRIVER = "gpu.nvidia.com"
POOL = "n1"
SHARED = """\
version: v1
sharing:
  {strategy}:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def node(name: str, config: str = "version: v1\n") -> tuple[Inventory, Plan]:
    backend = open_backend(name)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    return inventory, build_plan(inventory, parse_config(config))


def published(name: str, mode: SharesMode, config: str = "version: v1\n") -> list[Json]:
    inventory, plan = node(name, config)
    devices = dra_devices(inventory)
    offers = share_offers(plan, mode, devices)
    return [device_json(d, [], offers.get(d.uuid)) for d in devices]


# -- the flag ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("replicas", REPLICAS),
        ("disabled", SharesMode("disabled")),
        ("memory", SharesMode("memory")),
        (" unlimited ", SharesMode("unlimited")),
        ("4", SharesMode("count", 4)),
    ],
)
def test_the_flag_takes_nvidias_values_and_gpuslices_replicas(text: str, mode: SharesMode) -> None:
    assert SharesMode.parse(text) == mode
    assert SharesMode.parse(str(mode)) == mode


@pytest.mark.parametrize("text", ["", "0", "-2", "Memory", "2.5", "shares", "²"])
def test_any_other_value_is_refused_naming_the_flag_and_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=rf"--consumable-shares {text!r}: must be 'replicas'"):
        SharesMode.parse(text)


# -- what is published ---------------------------------------------------------------------


def test_replicas_mode_is_the_default_and_offers_only_what_the_config_shares() -> None:
    inventory, plan = node("sim:2xh100-80gb", "version: v1\n")
    assert share_offers(plan, REPLICAS, dra_devices(inventory)) == {}
    (shared, *_) = published("sim:1xh100-80gb", REPLICAS, SHARED.format(strategy="timeSlicing"))
    assert shared["capacity"][SHARES_CAPACITY]["value"] == "4"
    memory = shared["capacity"]["memory"]
    assert memory["requestPolicy"] == {
        "default": f"{int(memory['value']) // MIB // 4}Mi",
        "validRange": {"min": "1Mi", "step": "1Mi"},
    }


def test_disabled_offers_nothing_even_where_the_config_shares() -> None:
    (device,) = published(
        "sim:1xh100-80gb", SharesMode("disabled"), SHARED.format(strategy="timeSlicing")
    )
    assert "allowMultipleAllocations" not in device
    assert set(device["capacity"]) == {"memory"}


def test_memory_mode_a_claim_that_asks_nothing_takes_all_the_memory() -> None:
    """NVIDIA's `memory`: default the whole memory (whole MiB), min 1Mi, no shares."""
    devices = published("sim:2xh100-80gb", SharesMode("memory"))
    assert len(devices) == 2
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        whole = device["capacity"]["memory"]["value"]
        assert device["capacity"]["memory"]["requestPolicy"] == {
            "default": whole,
            "validRange": {"min": "1Mi", "max": whole, "step": "1Mi"},
        }
        assert SHARES_CAPACITY not in device["capacity"]


def test_unlimited_mode_a_claim_that_asks_nothing_takes_no_memory() -> None:
    (device, _) = published("sim:2xh100-80gb", SharesMode("unlimited"))
    whole = device["capacity"]["memory"]["value"]
    assert device["capacity"]["memory"]["requestPolicy"] == {
        "default": "0",
        "validRange": {"min": "0", "max": whole, "step": "1Mi"},
    }
    assert SHARES_CAPACITY not in device["capacity"]


def test_count_mode_publishes_n_shares_one_by_default_and_no_memory_by_default() -> None:
    (device, _) = published("sim:2xh100-80gb", SharesMode("count", 3))
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "0"
    assert device["capacity"][SHARES_CAPACITY] == {
        "value": "3",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "3", "step": "1"}},
    }


def test_nvidias_modes_offer_every_mig_device_too_and_round_memory_to_whole_mib() -> None:
    devices = published("sim:1xa100-40gb/mig=3g.20gb*1+1g.5gb*2", SharesMode("unlimited"))
    assert len(devices) == 3
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        assert re.fullmatch(r"\d+[MG]i", device["capacity"]["memory"]["value"])


def test_an_offered_mig_devices_engines_and_slices_are_taken_only_when_asked_for() -> None:
    """Without a policy each allocation would consume all of a capacity (KEP-5075): the
    copy engines or memory slices would make the first claim the only one."""
    (device, *_) = published("sim:1xa100-40gb/mig=3g.20gb*1+1g.5gb*2", SharesMode("count", 4))
    others = set(device["capacity"]) - {"memory", SHARES_CAPACITY, CORES_CAPACITY}
    assert {"multiprocessors", "copyEngines", "memorySlice4"} <= others
    for name in others:
        value = device["capacity"][name]["value"]
        if value == "0":  # the API refuses a step above the value; all of nothing is nothing
            assert "requestPolicy" not in device["capacity"][name]
            continue
        assert device["capacity"][name]["requestPolicy"] == {
            "default": "0",
            "validRange": {"min": "0", "max": value, "step": "1"},
        }


def test_an_mps_config_makes_the_offers_mps_in_nvidias_modes_too() -> None:
    inventory, plan = node("sim:1xh100-80gb", SHARED.format(strategy="mps"))
    (offer,) = share_offers(plan, SharesMode("count", 2), dra_devices(inventory)).values()
    assert (offer.strategy, offer.replicas, offer.mode) == ("mps", 2, "count")


@pytest.mark.parametrize(
    "mode", [REPLICAS, SharesMode("memory"), SharesMode("unlimited"), SharesMode("count", 2)]
)
def test_every_offered_device_has_cores_a_percentage_of_the_sms_none_by_default(
    mode: SharesMode,
) -> None:
    (device,) = published("sim:1xh100-80gb", mode, SHARED.format(strategy="timeSlicing"))
    assert device["capacity"][CORES_CAPACITY] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }


def test_a_device_not_offered_has_no_cores() -> None:
    (device, _) = published("sim:2xh100-80gb", REPLICAS)
    assert CORES_CAPACITY not in device["capacity"]


# -- what a claim gets ---------------------------------------------------------------------


def _work(offer: ShareOffer, consumed: dict[str, str]) -> ShareUse:
    inventory, _ = node("sim:1xh100-80gb")
    devices = {d.name: d for d in dra_devices(inventory)}
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": POOL,
        "device": "gpu-0",
        "shareID": "s-1",
        "consumedCapacity": consumed,
    }
    claim = {
        "metadata": {"uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    work = claim_work(
        claim,
        ClaimRef("ns", "uid-1", "c"),
        driver=DRIVER,
        pool=POOL,
        devices=devices,
        offers={"gpu-0": offer},
    )
    share = work.devices[0].share
    assert share is not None
    return share


TOTAL = 81559


def test_unlimited_a_claim_that_took_no_memory_gets_no_memory_limit_or_hint() -> None:
    share = _work(
        ShareOffer(1, SharingStrategy.TIME_SLICING, TOTAL, "unlimited"),
        {"memory": "0", "cores": "0"},
    )
    assert (share.memory_mib, share.shares, share.replicas) == (0, 1, 1)
    assert share_envs(share, TOTAL) == {}
    mps = _work(ShareOffer(1, SharingStrategy.MPS, TOTAL, "unlimited"), {"memory": "0"})
    assert share_envs(mps, TOTAL) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}


def test_memory_mode_a_claim_gets_the_memory_it_consumed() -> None:
    share = _work(ShareOffer(1, SharingStrategy.TIME_SLICING, TOTAL, "memory"), {"memory": "20Gi"})
    assert share.memory_mib == 20480
    assert share_envs(share, TOTAL)["GPUSLICE_MEMORY_LIMIT_MIB"] == "20480"
    whole = _work(ShareOffer(1, SharingStrategy.TIME_SLICING, TOTAL, "memory"), {})
    assert whole.memory_mib == TOTAL  # nothing recorded: the policy's default, all of it


def test_memory_mode_refuses_a_record_of_no_memory() -> None:
    with pytest.raises(ClaimError, match=r"consumedCapacity: must be at least 1Mi, got '0'"):
        _work(ShareOffer(1, SharingStrategy.TIME_SLICING, TOTAL, "memory"), {"memory": "0"})


def test_count_mode_thread_percentage_follows_the_shares() -> None:
    share = _work(
        ShareOffer(4, SharingStrategy.MPS, TOTAL, "count"), {"memory": "0", "shares": "1"}
    )
    assert share_envs(share, TOTAL) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}


def test_cores_under_mps_become_the_clients_active_thread_percentage() -> None:
    share = _work(
        ShareOffer(4, SharingStrategy.MPS, TOTAL),
        {"memory": "10Gi", "shares": "1", CORES_CAPACITY: "20"},
    )
    assert share.cores == 20
    assert share_envs(share, TOTAL) == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }


def test_no_cores_keeps_the_share_fraction() -> None:
    share = _work(ShareOffer(4, SharingStrategy.MPS, TOTAL), {"shares": "2", CORES_CAPACITY: "0"})
    assert share.thread_percentage == 50


@pytest.mark.parametrize("cores", ["101", "-1", "ten"])
def test_cores_outside_0_to_100_are_refused_naming_the_field(cores: str) -> None:
    with pytest.raises(ClaimError, match=r"results\[0\]\.consumedCapacity"):
        _work(ShareOffer(4, SharingStrategy.MPS, TOTAL), {CORES_CAPACITY: cores})


def test_the_demos_summary_reads_slices_published_in_count_mode() -> None:
    """A memory default of 0 (count mode) is no memory, not an unreadable quantity."""
    devices = published("sim:2xh100-80gb", SharesMode("count", 2))
    summary = slice_devices([{"spec": {"devices": devices}}])
    assert [(d.shares, d.share_memory_mib) for d in summary] == [(2, 0), (2, 0)]


# -- one rule for a share's default memory -------------------------------------------------


@pytest.mark.parametrize("name", ["sim:1xh100-80gb", "sim:1xgb10"])
@pytest.mark.parametrize(
    ("mode", "config"),
    [
        (REPLICAS, SHARED.format(strategy="timeSlicing")),
        (REPLICAS, SHARED.format(strategy="mps")),
        (SharesMode("count", 2), "version: v1\n"),
        (SharesMode("memory"), "version: v1\n"),
        (SharesMode("unlimited"), "version: v1\n"),
    ],
)
def test_a_claim_that_asks_no_memory_gets_the_default_the_slice_published(
    name: str, mode: SharesMode, config: str
) -> None:
    """The slice's memory default and what Prepare gives a share whose allocation recorded
    no memory are one rule (`ShareOffer.default_memory_mib`), on a GPU with memory and on a
    unified-memory one (no memory capacity: nothing published, nothing given)."""
    inventory, plan = node(name, config)
    devices = dra_devices(inventory)
    offers = share_offers(plan, mode, devices)
    (device,) = devices
    offer = offers[device.uuid]
    policy = device_json(device, [], offer)["capacity"].get("memory", {}).get("requestPolicy")
    default = "0" if policy is None else policy["default"]
    published_mib = 0 if default == "0" else quantity_mib(default)
    work = unrecorded_share(device.name, {device.name: device}, {device.name: offer})
    share = work.devices[0].share
    assert share is not None
    assert share.memory_mib == published_mib == offer.default_memory_mib
    if inventory.gpus[0].memory_reported and mode == REPLICAS:
        assert published_mib == inventory.gpus[0].memory_mib // 4
    if not inventory.gpus[0].memory_reported:
        assert published_mib == 0
