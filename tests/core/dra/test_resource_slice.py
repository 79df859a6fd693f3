"""Reading a stored ResourceSlice (`core.dra.resource_slice`) never raises: a slice or a
device missing its metadata, spec, pool or devices reads as one without them, which the
publisher compares, logs and rewrites as it did when it walked the dicts itself."""

from __future__ import annotations

import pytest

from gpuslice.core.dra.publish import plan_slices
from gpuslice.core.dra.resource_slice import StoredDevice, StoredSlice, stored_devices
from gpuslice.core.jsontypes import Json

PARTITION: Json = {"name": "gpu-0-mig-1g10gb-19-3", "attributes": {"type": {"string": "mig"}}}


@pytest.mark.parametrize(
    "obj",
    [{}, {"metadata": None, "spec": None}, {"metadata": "x", "spec": {"pool": None}}],
    ids=["empty", "nulls", "misshapen"],
)
def test_a_slice_without_metadata_spec_or_pool_reads_as_nameless_without_generation(
    obj: Json,
) -> None:
    s = StoredSlice.read(obj)
    assert (s.name, s.resource_version, s.generation) == ("", "", None)
    assert stored_devices(obj) == ()


def test_name_version_and_generation_are_read() -> None:
    obj: Json = {
        "metadata": {"name": "n1-gpu-00-x", "resourceVersion": "42"},
        "spec": {"pool": {"generation": 3}, "devices": [PARTITION]},
    }
    s = StoredSlice.read(obj)
    assert (s.name, s.resource_version, s.generation) == ("n1-gpu-00-x", "42", 3)


@pytest.mark.parametrize("spec", [{}, {"devices": None}, {"devices": []}, {"pool": {}}])
def test_a_spec_without_devices_has_none(spec: Json) -> None:
    assert stored_devices({"spec": spec}) == ()


def test_a_device_says_what_the_api_server_kept_of_it() -> None:
    shared: Json = {"name": "gpu-0", "capacity": {"shares": {"value": "8"}}}
    [partition, whole, bare] = stored_devices({"spec": {"devices": [PARTITION, shared, {}]}})
    assert partition == StoredDevice(
        name="gpu-0-mig-1g10gb-19-3",
        partition=True,
        consumes_counters=False,
        offers_shares=False,
        multiple_allocations=False,
    )
    assert (whole.offers_shares, whole.multiple_allocations) == (True, False)
    assert bare == StoredDevice(None, False, False, False, False)


def test_a_mig_device_with_a_uuid_is_not_a_partition() -> None:
    device = {**PARTITION, "attributes": {"type": {"string": "mig"}, "uuid": {"string": "MIG-1"}}}
    assert not StoredDevice.read(device).partition


def test_a_stored_slice_without_spec_is_rewritten_at_generation_1() -> None:
    obj: Json = {"metadata": {"name": "n1-gpu-00-x", "resourceVersion": "7"}}
    changes = plan_slices(
        [obj], [{"name": "gpu-0"}], driver="gpu.nvidia.com", node="n1", node_uid=""
    )
    [updated] = changes.update
    assert updated["metadata"] == obj["metadata"]
    assert updated["spec"]["pool"]["generation"] == 1
