"""Health policy: NVIDIA's env-var rules, MIG attribution, all replicas, recovery."""

from __future__ import annotations

import pytest

from gpuslice.core.devices import Gpu, GpuUuid, Inventory, MigDevice, MigUuid
from gpuslice.core.health import NO_INSTANCE, HealthEvent, HealthPolicy, HealthState, device_health
from gpuslice.core.sharing.model import AdvertisedDevice, DeviceId, PhysicalDevice, replica_id


def _mig(parent: str, j: int, gi: int, ci: int) -> MigDevice:
    return MigDevice(
        uuid=MigUuid(f"MIG-{j}"),
        parent_uuid=GpuUuid(parent),
        parent_index=1,
        index=j,
        profile="1g.10gb",
        gi_id=gi,
        ci_id=ci,
        memory_mib=9728,
        multiprocessors=14,
        slices_gi=1,
        slices_ci=1,
        placement_start=j,
        placement_size=1,
    )


PLAIN = Gpu(0, GpuUuid("GPU-plain"), "Tesla T4", 15360, 40, (7, 5), "00000000:01:00.0", 0)
MIGGED = Gpu(
    1,
    GpuUuid("GPU-mig"),
    "NVIDIA A100-SXM4-80GB",
    81920,
    108,
    (8, 0),
    "00000000:02:00.0",
    1,
    mig_capable=True,
    mig_enabled=True,
    mig_devices=(_mig("GPU-mig", 0, 7, 0), _mig("GPU-mig", 1, 8, 0), _mig("GPU-mig", 2, 9, 0)),
)
INV = Inventory(gpus=(PLAIN, MIGGED), driver_version="550.54.15", cuda_driver_version=12040)
DEFAULT, _ = HealthPolicy.from_env(None, None)


def xid(
    n: int | None, gpu: str = "GPU-plain", gi: int | None = None, ci: int | None = None
) -> HealthEvent:
    return HealthEvent(kind="xid", gpu_uuid=gpu, xid=n, gi_id=gi, ci_id=ci)


@pytest.mark.parametrize("n", [13, 31, 43, 45, 68, 109])
def test_default_ignored_xids(n: int) -> None:
    assert DEFAULT.affected(xid(n), INV) == frozenset()


@pytest.mark.parametrize("n", [48, 79, 94, 95])
def test_other_xids_mark_the_gpu(n: int) -> None:
    assert DEFAULT.affected(xid(n), INV) == {"GPU-plain"}


def test_unreadable_xid_counts_and_unknown_gpu_is_ignored() -> None:
    assert DEFAULT.affected(xid(None), INV) == {"GPU-plain"}
    assert DEFAULT.affected(xid(79, gpu="GPU-gone"), INV) == frozenset()


@pytest.mark.parametrize("value", ["all", "ALL", "xids", " Xids ", "79,all"])
def test_disable_all_turns_checking_off(value: str) -> None:
    policy, warnings = HealthPolicy.from_env(value, None)
    assert warnings == ()
    assert policy.checking_disabled
    assert policy.affected(xid(79), INV) == frozenset()
    assert policy.affected(HealthEvent(kind="lost", gpu_uuid="GPU-plain"), INV) == frozenset()


def test_disable_numbers_add_to_defaults() -> None:
    policy, warnings = HealthPolicy.from_env("79, 48", "")
    assert warnings == ()
    assert policy.affected(xid(79), INV) == frozenset()
    assert policy.affected(xid(48), INV) == frozenset()
    assert policy.affected(xid(13), INV) == frozenset()
    assert policy.affected(xid(94), INV) == {"GPU-plain"}


def test_enable_reenables_listed_xids_even_when_all_disabled_or_default() -> None:
    policy, _ = HealthPolicy.from_env("all", "43,79")
    assert not policy.checking_disabled
    assert policy.affected(xid(43), INV) == {"GPU-plain"}
    assert policy.affected(xid(79), INV) == {"GPU-plain"}
    assert policy.affected(xid(94), INV) == frozenset()
    only_default, _ = HealthPolicy.from_env(None, "13")
    assert only_default.affected(xid(13), INV) == {"GPU-plain"}
    assert only_default.affected(xid(31), INV) == frozenset()


def test_enable_all_reenables_everything_including_defaults() -> None:
    policy, _ = HealthPolicy.from_env("all,79", "all")
    for n in (13, 31, 79, 109):
        assert policy.affected(xid(n), INV) == {"GPU-plain"}


def test_malformed_entries_become_warnings_naming_the_variable_and_value() -> None:
    policy, warnings = HealthPolicy.from_env("79,abc,,-5", "x1")
    assert len(warnings) == 3
    assert warnings[0].startswith('DP_DISABLE_HEALTHCHECKS: ignoring "abc"')
    assert '"-5"' in warnings[1]
    assert warnings[2].startswith('DP_ENABLE_HEALTHCHECKS: ignoring "x1"')
    assert all('"all"' in w for w in warnings)
    assert policy.affected(xid(79), INV) == frozenset()


def test_mig_xid_with_instance_marks_only_that_mig_device() -> None:
    assert DEFAULT.affected(xid(79, "GPU-mig", gi=8, ci=0), INV) == {"MIG-1"}
    assert DEFAULT.affected(xid(79, "GPU-mig", gi=8, ci=3), INV) == frozenset()
    assert DEFAULT.affected(xid(79, "GPU-mig", gi=9), INV) == {"MIG-2"}


@pytest.mark.parametrize(("gi", "ci"), [(None, None), (NO_INSTANCE, NO_INSTANCE)])
def test_unattributed_mig_xid_marks_gpu_and_all_mig_devices(gi: int | None, ci: int | None) -> None:
    assert DEFAULT.affected(xid(79, "GPU-mig", gi=gi, ci=ci), INV) == {
        "GPU-mig",
        "MIG-0",
        "MIG-1",
        "MIG-2",
    }


def test_lost_marks_gpu_and_mig_devices_and_recovered_clears_them() -> None:
    state = HealthState()
    state = state.apply(xid(79), INV, DEFAULT)
    state = state.apply(HealthEvent(kind="lost", gpu_uuid="GPU-mig"), INV, DEFAULT)
    assert state.unhealthy == {"GPU-plain", "GPU-mig", "MIG-0", "MIG-1", "MIG-2"}
    state = state.apply(HealthEvent(kind="recovered", gpu_uuid="GPU-mig"), INV, DEFAULT)
    assert state.unhealthy == {"GPU-plain"}
    state = state.apply(xid(13), INV, DEFAULT)
    assert state.unhealthy == {"GPU-plain"}
    state = state.apply(HealthEvent(kind="recovered", gpu_uuid="GPU-plain"), INV, DEFAULT)
    assert state.unhealthy == frozenset()


def test_an_ignored_xid_is_noticed_on_the_devices_it_is_about_until_recovery() -> None:
    """NVIDIA's DRA driver publishes an ignored XID as an informational taint: the state
    remembers it (last XID per device), the device stays healthy; recovery forgets it."""
    state = HealthState().apply(xid(43), INV, DEFAULT)
    assert (state.unhealthy, dict(state.noticed)) == (frozenset(), {"GPU-plain": 43})
    state = state.apply(xid(13, "GPU-mig", gi=8, ci=0), INV, DEFAULT)
    assert dict(state.noticed) == {"GPU-plain": 43, "MIG-1": 13}
    state = state.apply(xid(31), INV, DEFAULT)
    assert state.noticed["GPU-plain"] == 31
    state = state.apply(xid(79), INV, DEFAULT)  # counted: unhealthy, not noticed anew
    assert state.unhealthy == {"GPU-plain"}
    assert state.noticed["GPU-plain"] == 31
    state = state.apply(HealthEvent(kind="recovered", gpu_uuid="GPU-plain"), INV, DEFAULT)
    assert (state.unhealthy, dict(state.noticed)) == (frozenset(), {"MIG-1": 13})


def test_nothing_is_noticed_with_checking_off_or_for_an_unknown_gpu() -> None:
    off, _ = HealthPolicy.from_env("all", None)
    assert off.noticed(xid(43), INV) == frozenset()
    assert DEFAULT.noticed(xid(43, "GPU-gone"), INV) == frozenset()
    assert DEFAULT.noticed(xid(79), INV) == frozenset()
    assert DEFAULT.noticed(HealthEvent(kind="lost", gpu_uuid="GPU-plain"), INV) == frozenset()
    assert DEFAULT.noticed(xid(43, "GPU-mig"), INV) == {"GPU-mig", "MIG-0", "MIG-1", "MIG-2"}


def _phys(uuid: str, gpu_uuid: str, kind: str) -> PhysicalDevice:
    return PhysicalDevice(
        uuid=uuid,
        index_id="1:0" if kind == "mig" else "0",
        gpu_uuid=GpuUuid(gpu_uuid),
        gpu_index=0,
        kind="mig" if kind == "mig" else "gpu",
        product_name="x",
        memory_mib=1,
        multiprocessors=1,
        minor=0,
    )


def test_all_replicas_of_an_unhealthy_gpu_are_unhealthy() -> None:
    phys = _phys("GPU-plain", "GPU-plain", "gpu")
    replicas = [AdvertisedDevice(replica_id("GPU-plain", n), phys, n, 4) for n in range(4)]
    state = HealthState().apply(xid(79), INV, DEFAULT)
    assert [device_health(d, state.unhealthy) for d in replicas] == ["Unhealthy"] * 4
    assert [device_health(d, frozenset()) for d in replicas] == ["Healthy"] * 4


def test_mig_device_health_follows_itself_or_its_parent() -> None:
    devs = [
        AdvertisedDevice(DeviceId(f"MIG-{j}"), _phys(f"MIG-{j}", "GPU-mig", "mig"), None, 1)
        for j in range(3)
    ]
    one = HealthState().apply(xid(79, "GPU-mig", gi=7, ci=0), INV, DEFAULT)
    assert [device_health(d, one.unhealthy) for d in devs] == ["Unhealthy", "Healthy", "Healthy"]
    assert [device_health(d, frozenset({"GPU-mig"})) for d in devs] == ["Unhealthy"] * 3
