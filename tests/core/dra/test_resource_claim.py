"""A ResourceClaim is read once, at the edge of the core, into the fields Prepare uses:
reading never raises, whatever the JSON, and a field of the wrong shape reaches Prepare as
absent, so it is refused with the field named rather than failing on the shape."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.dra.resource_claim import Allocation, DeviceResult, ResourceClaim
from gpuslice.core.dra.sharing import ClaimConfigError, resolve
from gpuslice.core.jsontypes import Json

DRIVER = "gpu.nvidia.com"

KEYS = st.sampled_from(
    ["metadata", "uid", "status", "allocation", "devices", "results", "config", "opaque",
     "driver", "parameters", "requests", "source", "request", "device", "pool", "shareID",
     "consumedCapacity", "adminAccess"]
)  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(KEYS | st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_reading_never_raises(obj: Any) -> None:
    claim = ResourceClaim.read(obj)
    assert claim.is_object == isinstance(obj, dict)
    with contextlib.suppress(ClaimConfigError):  # a refusal, naming the field: the one way out
        resolve(Allocation.read(obj), DRIVER, {"gpu-0": "gpu"})


def test_the_fields_prepare_uses() -> None:
    claim = ResourceClaim.read({
        "metadata": {"uid": "u1", "namespace": "ml", "name": "c"},
        "status": {"allocation": {"devices": {
            "results": [
                "not an entry",
                {"request": "main/sub", "driver": DRIVER, "pool": "n1", "device": "gpu-0",
                 "shareID": "s1", "adminAccess": True, "consumedCapacity": {"memory": "1Gi"}},
            ],
            "config": [{"source": "FromClaim", "requests": ["main"],
                        "opaque": {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}}],
        }}},
    })  # fmt: skip
    assert (claim.uid, claim.namespace, claim.name) == ("u1", "ml", "c")
    assert claim.allocation is not None
    assert claim.allocation.results == (
        DeviceResult(1, "main/sub", DRIVER, "n1", "gpu-0", "s1", True, {"memory": "1Gi"}),
    )
    (config,) = claim.allocation.configs
    assert (config.source, config.requests, config.driver, config.parameters) == (
        "FromClaim",
        ("main",),
        DRIVER,
        {"kind": "GpuConfig"},
    )


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ({"results": [], "config": ["not an entry"]}, "config[0].source: must be FromClass"),
        (
            {"results": [], "config": [{"source": "FromClaim", "requests": "main",
                                        "opaque": {"driver": DRIVER}}]},
            "config[0].requests: must be a list of request names",
        ),
    ],
)  # fmt: skip
def test_a_config_of_the_wrong_shape_is_refused_with_its_field_named(
    devices: Json, message: str
) -> None:
    with pytest.raises(ClaimConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resolve({"devices": devices}, DRIVER, {"gpu-0": "gpu"})


def test_shapes_that_are_not_objects_read_as_absent() -> None:
    assert ResourceClaim.read([1]).is_object is False
    assert ResourceClaim.read({"status": {"allocation": []}}).allocation is None
    assert Allocation.read({"devices": ["x"]}) == Allocation(None, ())
    assert Allocation.read({"devices": {"results": {}}}).results is None
