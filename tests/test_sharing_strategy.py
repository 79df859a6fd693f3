"""`SharingStrategy`, the one spelling of how a device is shared: every wire spelling (GFD's
label, NVIDIA's DRA name, the reports' kind, describe's isolation) is a conversion of a
member, and the guard's and caps' questions are its predicates."""

from __future__ import annotations

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.dra.claims import claim_work
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.preparation import SetInterval, StartDaemon, preparation
from gpuslice.core.dra.prepared import AppliedSharing, Checkpoint, PreparedClaim, encode
from gpuslice.core.dra.publish import dra_devices
from gpuslice.core.sharing.model import SharingStrategy

DRIVER = "gpu.nvidia.com"
REF = ClaimRef("ns", "uid-1", "c")

NONE, TIME_SLICING, MPS, MIG = (
    SharingStrategy.NONE,
    SharingStrategy.TIME_SLICING,
    SharingStrategy.MPS,
    SharingStrategy.MIG,
)


@pytest.mark.parametrize(
    ("member", "value", "label", "kind", "isolation", "shares_memory"),
    [
        (NONE, "none", "none", "exclusive", "none", False),
        (TIME_SLICING, "time-slicing", "time-slicing", "time-slicing", "none", True),
        (MPS, "mps", "mps", "mps", "mps", True),
        (MIG, "mig", "none", "mig", "mig", False),
    ],
)
def test_each_spelling_is_a_conversion_of_the_member(
    member: SharingStrategy,
    value: str,
    label: str,
    kind: str,
    isolation: str,
    shares_memory: bool,
) -> None:
    assert (member.value, str(member), SharingStrategy(value)) == (value, value, member)
    assert member.label_value == label
    assert member.entitlement_kind == kind
    assert member.isolation == isolation
    assert member.shares_memory is shares_memory


def test_nvidias_dra_names_round_trip_and_only_two_members_have_one() -> None:
    assert (TIME_SLICING.nvidia_name, MPS.nvidia_name) == ("TimeSlicing", "MPS")
    assert SharingStrategy.from_nvidia("TimeSlicing") is TIME_SLICING
    assert SharingStrategy.from_nvidia("MPS") is MPS
    assert SharingStrategy.from_nvidia(None) is NONE
    for member in (NONE, MIG):
        with pytest.raises(ValueError, match="no name"):
            _ = member.nvidia_name


def test_prepares_records_name_the_strategies_as_nvidia_does_in_the_checkpoint() -> None:
    """The checkpoint's `strategy` of a time-slice interval's and an MPS daemon's record is
    NVIDIA's name (`TimeSlicing`, `MPS`), as every agent wrote it: a restarted agent and an
    older one read the same bytes."""
    backend = open_backend("sim:1xh100-80gb")
    try:
        devices = {d.name: d for d in dra_devices(backend.inventory())}
    finally:
        backend.close()
    records: list[AppliedSharing] = []
    for sharing in (
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        {"strategy": "MPS"},
    ):
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                  "sharing": sharing}  # fmt: skip
        config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
        result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
        allocation = {"devices": {"results": [result], "config": config}}
        claim = {"metadata": {"uid": REF.uid}, "status": {"allocation": allocation}}
        work = claim_work(claim, REF, driver=DRIVER, pool="n1", devices=devices, offers={})
        records.extend(
            step.record
            for step in preparation(work, "/plug/mps").steps
            if isinstance(step, SetInterval | StartDaemon)
        )
    assert [r.strategy for r in records] == ["TimeSlicing", "MPS"]
    prepared = PreparedClaim(REF.uid, REF.namespace, REF.name, "PrepareCompleted",
                          applied=tuple(records))  # fmt: skip
    raw = encode(Checkpoint("boot", {REF.uid: prepared}))
    assert b'"strategy":"TimeSlicing"' in raw.replace(b" ", b"")
    assert b'"strategy":"MPS"' in raw.replace(b" ", b"")
