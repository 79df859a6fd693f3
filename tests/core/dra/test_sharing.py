"""NVIDIA's opaque configs accepted unchanged, resolved with NVIDIA's precedence, and every
bad one refused with the entry and field named."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from gpuslice.core.dra.sharing import ClaimConfigError, MpsSettings, resolve
from gpuslice.core.jsontypes import Json

DRIVER = "gpu.nvidia.com"
API = "resource.nvidia.com/v1beta1"


def cfg(params: Json, requests: list[str] | None = None, source: str = "FromClaim",
        driver: str = DRIVER) -> Json:  # fmt: skip
    return {
        "source": source,
        "requests": requests or [],
        "opaque": {"driver": driver, "parameters": params},
    }


def result(request: str, device: str, driver: str = DRIVER) -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": "n1", "device": device}


def alloc(results: list[dict[str, str]], configs: list[Json]) -> Json:
    return {"devices": {"results": results, "config": configs}}


KINDS: dict[str, Literal["gpu", "mig"]] = {
    "gpu-0": "gpu",
    "gpu-1": "gpu",
    "gpu-0-mig-1g10gb-19-0": "mig",
}
MPS_DEMO = {  # NVIDIA's gpu-test-mps demo, unchanged
    "apiVersion": API,
    "kind": "GpuConfig",
    "sharing": {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
        },
    },
}


def test_nvidias_mps_demo_config_is_accepted_unchanged() -> None:
    got = resolve(alloc([result("mps-gpu", "gpu-0")], [cfg(MPS_DEMO, ["mps-gpu"])]), DRIVER, KINDS)
    assert got[0].strategy == "MPS"
    assert got[0].mps == MpsSettings(active_thread_percentage=50, pinned_limit_mib=10240)
    assert got[0].source == "config[0]"


@pytest.mark.parametrize(("name", "value"), [("Default", 0), ("Short", 1), ("Medium", 2),
                                             ("Long", 3)])  # fmt: skip
def test_time_slicing_intervals(name: str, value: int) -> None:
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": name}}
    ts = {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}
    got = resolve(alloc([result("r", "gpu-0")], [cfg(ts)]), DRIVER, KINDS)
    assert (got[0].strategy, got[0].interval) == ("TimeSlicing", value)


def test_no_config_means_no_sharing_and_other_drivers_configs_are_not_read() -> None:
    other = cfg({"anything": "goes"}, driver="other.example.com")
    got = resolve(alloc([result("r", "gpu-0"), result("x", "d", "other.example.com")], [other]),
                  DRIVER, KINDS)  # fmt: skip
    assert list(got) == [0]
    assert got[0].strategy is None
    assert got[0].source == "default"


def test_claim_config_beats_class_config_and_later_beats_earlier() -> None:
    ts = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    mps = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    configs = [cfg(mps, source="FromClaim"), cfg(ts, source="FromClass")]
    got = resolve(alloc([result("r", "gpu-0")], configs), DRIVER, KINDS)
    assert got[0].strategy == "MPS"  # the claim's, though listed first
    later = resolve(alloc([result("r", "gpu-0")], [cfg(ts), cfg(mps)]), DRIVER, KINDS)
    assert later[0].strategy == "MPS"


def test_precedence_walks_down_like_nvidias_and_stops_at_a_fitting_catch_all() -> None:
    ts = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    mps = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    # a later catch-all outranks an earlier config that names the request (NVIDIA's walk)
    later_catch_all = [cfg(mps, ["main"]), cfg(ts)]
    got = resolve(alloc([result("main", "gpu-0")], later_catch_all), DRIVER, KINDS)
    assert got[0].strategy == "TimeSlicing"
    # a later config naming the request outranks an earlier catch-all
    later_named = [cfg(ts), cfg(mps, ["main"])]
    got = resolve(alloc([result("main", "gpu-0"), result("other", "gpu-1")], later_named),
                  DRIVER, KINDS)  # fmt: skip
    assert (got[0].strategy, got[1].strategy) == ("MPS", "TimeSlicing")


def test_a_config_naming_a_main_request_applies_to_its_subrequests() -> None:
    """Kubernetes' API: naming `main` applies to all its subrequests. NVIDIA's driver
    compares the result's `main/sub` exactly and would not apply it (a deliberate
    difference, docs/configuration.md)."""
    mps = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    got = resolve(alloc([result("main/big", "gpu-0")], [cfg(mps, ["main"])]), DRIVER, KINDS)
    assert got[0].strategy == "MPS"


def test_a_config_source_that_is_neither_class_nor_claim_is_refused() -> None:
    mps = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    with pytest.raises(ClaimConfigError, match="source: must be FromClass or FromClaim"):
        resolve(alloc([result("r", "gpu-0")], [cfg(mps, source="FromElsewhere")]), DRIVER, KINDS)


def test_nvidias_multi_user_field_is_read_both_ways() -> None:
    """NVIDIA's `mpsConfig.multiUser` (its driver's HEAD): false is the default daemon,
    true a multi-user one, on a GpuConfig and on a MigDeviceConfig alike."""
    for kind, device in (("GpuConfig", "gpu-0"), ("MigDeviceConfig", "gpu-0-mig-1g10gb-19-0")):
        base = {"apiVersion": API, "kind": kind}
        off = dict(base, sharing={"strategy": "MPS", "mpsConfig": {"multiUser": False}})
        got = resolve(alloc([result("r", device)], [cfg(off)]), DRIVER, KINDS)[0]
        assert (got.strategy, got.mps) == ("MPS", MpsSettings(multi_user=False))
        on = dict(base, sharing={"strategy": "MPS", "mpsConfig": {"multiUser": True}})
        got = resolve(alloc([result("r", device)], [cfg(on)]), DRIVER, KINDS)[0]
        assert got.mps == MpsSettings(multi_user=True)
    bad = dict(base, sharing={"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}})
    with pytest.raises(ClaimConfigError, match=r"config\[0\].opaque.parameters: .*multiUser"):
        resolve(alloc([result("r", "gpu-0")], [cfg(bad)]), DRIVER, KINDS)


def test_a_mig_device_takes_only_a_mig_device_config() -> None:
    mig_mps = {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    gpu_ts = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    results = [result("r", "gpu-0-mig-1g10gb-19-0"), result("r2", "gpu-0")]
    got = resolve(alloc(results, [cfg(gpu_ts), cfg(mig_mps)]), DRIVER, KINDS)
    assert (got[0].kind, got[0].strategy) == ("mig", "MPS")
    assert (got[1].kind, got[1].strategy) == ("gpu", "TimeSlicing")
    with pytest.raises(ClaimConfigError, match=r"config\[0\]: GpuConfig names request 'r'"):
        resolve(alloc(results[:1], [cfg(gpu_ts, ["r"])]), DRIVER, KINDS)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"apiVersion": API, "kind": "VfioDeviceConfig"}, "unknown config kind 'VfioDeviceConfig'"),
        ({"apiVersion": "v9", "kind": "GpuConfig"}, "of apiVersion 'v9'"),
        ({"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "Magic"}},
         "sharing.strategy"),
        ({"apiVersion": API, "kind": "GpuConfig", "sharnig": {}}, "sharnig: unknown field"),
        ({"apiVersion": API, "kind": "GpuConfig",
          "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}},
         "defaultActiveThreadPercentage"),
        ({"apiVersion": API, "kind": "GpuConfig",
          "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}},
         "at least 1Mi"),
        ({"apiVersion": API, "kind": "GpuConfig",
          "sharing": {"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}},
         "timeSlicingConfig: not allowed with strategy MPS"),
        ({"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing",
          "timeSlicingConfig": {"interval": "Forever"}}}, "interval"),
        ("not an object", "parameters must be an object"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_entry_and_the_field(params: Any, message: str) -> None:
    with pytest.raises(ClaimConfigError) as err:
        resolve(alloc([result("r", "gpu-0")], [cfg(MPS_DEMO), cfg(params)]), DRIVER, KINDS)
    assert message in str(err.value)
    assert str(err.value).startswith("config[1]")


def test_per_device_pinned_limits_by_uuid_or_index() -> None:
    params = {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultPinnedDeviceMemoryLimit": "4Gi",
        "defaultPerDevicePinnedMemoryLimit": {"GPU-a": "1Gi", "1": 2147483648}}}}  # fmt: skip
    [sharing] = resolve(alloc([result("r", "gpu-0")], [cfg(params)]), DRIVER, KINDS).values()
    assert sharing.mps is not None
    assert sharing.mps.limit_for("GPU-a", 0) == 1024
    assert sharing.mps.limit_for("GPU-b", 1) == 2048
    assert sharing.mps.limit_for("GPU-c", 2) == 4096


def test_gpuslice_guard_config_rides_along_in_its_own_group() -> None:
    guard = {
        "apiVersion": "resource.gpuslice.io/v1alpha1",
        "kind": "GuardConfig",
        "mode": "enforce",
    }
    got = resolve(alloc([result("r", "gpu-0")], [cfg(MPS_DEMO), cfg(guard)]), DRIVER, KINDS)
    assert (got[0].strategy, got[0].guard_mode) == ("MPS", "enforce")
