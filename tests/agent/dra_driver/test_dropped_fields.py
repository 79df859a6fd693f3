"""What the publisher hears when the API server drops a feature's fields from the slices it
wrote back (`SlicePublisher._check_dropped`), read through `core.dra.resource_slice`: a
written slice missing its spec or devices drops nothing."""

from __future__ import annotations

from typing import cast

import pytest

from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.core.jsontypes import Json
from gpuslice.ports import DraObjects
from gpuslice.testing.logcapture import captured_events

PARTITION: Json = {"name": "gpu-0-mig-1g10gb-19-3", "attributes": {"type": {"string": "mig"}}}
SHARED: Json = {"name": "gpu-0", "capacity": {"shares": {"value": "8"}}}


def publisher() -> SlicePublisher:
    """Nothing here reaches the API: the check reads the replies it is given."""
    unused = cast(DraObjects, object())
    return SlicePublisher(unused, driver="gpu.nvidia.com", node="n1", snapshot=lambda: None)


def dropped(written: list[Json]) -> tuple[bool, list[tuple[str, object]]]:
    p = publisher()
    with captured_events() as events:
        p._check_dropped(written)
    return p.partitionable, [(e["event"], e.get("device")) for e in events]


@pytest.mark.parametrize(
    "written",
    [
        [{}],
        [{"spec": None}],
        [{"spec": {"pool": {"generation": 1}}}],
        [{"spec": {"devices": None}}],
    ],
    ids=["no-spec", "null-spec", "no-devices", "null-devices"],
)
def test_a_slice_without_spec_or_devices_drops_nothing(written: list[Json]) -> None:
    assert dropped(written) == (True, [])


def test_a_partition_without_its_counters_withdraws_dynamic_mig() -> None:
    assert dropped([{"spec": {"devices": [PARTITION]}}]) == (
        False,
        [("dra-counters-dropped", "gpu-0-mig-1g10gb-19-3")],
    )
    kept = {**PARTITION, "consumesCounters": []}
    assert dropped([{"spec": {"devices": [kept]}}]) == (True, [])


def test_shares_without_multiple_allocations_are_warned_once() -> None:
    assert dropped([{"spec": {"devices": [SHARED, SHARED]}}]) == (
        True,
        [("dra-shares-dropped", "gpu-0")],
    )
    kept = {**SHARED, "allowMultipleAllocations": True}
    assert dropped([{"spec": {"devices": [kept]}}]) == (True, [])


def test_a_nameless_device_is_logged_without_a_name() -> None:
    assert dropped([{"spec": {"devices": [{"capacity": {"shares": {}}}]}}]) == (
        True,
        [("dra-shares-dropped", None)],
    )
