"""The DRA checkpoint's explicit version: older files migrate step by step, newer ones read
forward, and no document, however shaped, makes decoding raise, even one whose checksum
is right (so it reaches the record readers)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.dra.kubelet_api import PreparedDevice
from gpuslice.core.dra.prepared import (
    FORMAT,
    VERSION,
    Checkpoint,
    DeviceUse,
    PreparedClaim,
    decode,
    encode,
    migrate,
    sealed,
)
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import SharingStrategy

UID = "4f1c8a2e-0000-4000-8000-000000000002"
CLAIM = PreparedClaim(
    uid=UID,
    namespace="ml",
    name="c",
    state="PrepareCompleted",
    devices=(PreparedDevice(("r",), "n1", "gpu-0", ("k8s.gpuslice.io/claim=x",)),),
    uses=(DeviceUse("gpu-0", "GPU-a", SharingStrategy.MPS, 2),),
)


def _with_version(version: object) -> bytes:
    doc = json.loads(encode(Checkpoint("b", {UID: CLAIM})))
    doc["version"] = version
    return json.dumps(doc).encode()


def test_a_complete_record_is_written_at_this_version_and_reads_back() -> None:
    raw = encode(Checkpoint("b", {UID: CLAIM}))
    assert json.loads(raw)["version"] == VERSION
    got = decode(raw, "b")
    assert (got.status, got.checkpoint.claims) == ("ok", {UID: CLAIM})
    assert got.checkpoint.claims[UID].uses[0].strategy is SharingStrategy.MPS


@pytest.mark.parametrize("version", [0, -1, "1", None, True, [1]])  # 1.5: no float parses
def test_a_version_that_is_not_one_makes_the_file_corrupt(version: object) -> None:
    got = decode(_with_version(version), "b")
    assert (got.status, got.checkpoint.claims) == ("corrupt", {})
    assert "not a checkpoint version" in got.reason


def test_migrations_run_in_order_from_the_files_version() -> None:
    def rename(data: Json) -> Json:
        return {**data, "steps": [*data.get("steps", []), "1->2"]}

    def add(data: Json) -> Json:
        return {**data, "steps": [*data.get("steps", []), "2->3"]}

    steps = {1: rename, 2: add}
    assert migrate({}, 1, steps, current=3) == {"steps": ["1->2", "2->3"]}
    assert migrate({}, 2, steps, current=3) == {"steps": ["2->3"]}
    assert migrate({"x": 1}, 3, steps, current=3) == {"x": 1}
    assert migrate({"x": 1}, 9, steps, current=3) == {"x": 1}  # newer: read forward
    with pytest.raises(ValueError, match="version 1 cannot be read by version 3"):
        migrate({}, 1, {2: add}, current=3)


def test_an_unknown_use_strategy_reads_as_none() -> None:
    """Written by a newer version with a strategy this one lacks: read, not refused."""
    doc = json.loads(encode(Checkpoint("b", {UID: CLAIM})))
    doc["data"]["claims"][UID]["uses"][0]["strategy"] = "fractional"
    got = decode(sealed(doc["data"]), "b")
    assert got.status == "ok"
    assert got.checkpoint.claims[UID].uses[0].strategy is SharingStrategy.NONE


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=30,
)  # fmt: skip
FIELDS = st.sampled_from(
    ["namespace", "name", "state", "devices", "applied", "uses", "guardMode", "strategy",
     "gpus", "mpsKey", "limitsMiB", "migDevices", "sharedBy", "physical", "device", "pool",
     "cdiIDs", "requests", "shareID", "interval", "threadPercentage", "entitlementMiB"]
)  # fmt: skip
RECORDISH = st.recursive(
    JSON,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELDS, inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None)
@given(
    claims=st.dictionaries(st.text(max_size=40), RECORDISH, max_size=3),
    boot=JSON,
    version=st.integers(-2, 4) | JSON,
)
def test_no_document_with_a_good_checksum_makes_decode_raise(
    claims: Json, boot: object, version: object
) -> None:
    doc = json.loads(sealed({"bootID": boot, "claims": claims}))
    doc["version"] = version
    got = decode(json.dumps(doc).encode(), "b")
    assert got.status in ("ok", "corrupt", "stale")
    assert doc["format"] == FORMAT
