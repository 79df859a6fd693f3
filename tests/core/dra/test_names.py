"""Names from the wire or the checkpoint are checked before they become paths."""

from __future__ import annotations

import pytest

from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.names import (
    BadName,
    check_claim_ref,
    check_claim_uid,
    check_path_component,
)

GOOD_UID = "5c1f3a2e-9b7d-4e0a-8f61-2d3c4b5a6978"


def test_a_well_formed_reference_passes_unchanged() -> None:
    ref = ClaimRef("team-a", GOOD_UID, "pod-1-gpu.claim")
    assert check_claim_ref(ref) is ref


@pytest.mark.parametrize(
    "uid",
    ["../../etc", "a/b", "..", "", GOOD_UID + "/x", GOOD_UID[:-1] + "g", "x" * 36, GOOD_UID + "\n"],
)
def test_a_uid_that_is_not_a_uuid_is_refused_and_quoted(uid: str) -> None:
    with pytest.raises(BadName, match=r"claim\.uid .* is not a UID"):
        check_claim_uid(uid)


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        (ClaimRef("../kube-system", GOOD_UID, "c"), "claim.namespace"),
        (ClaimRef("Team", GOOD_UID, "c"), "claim.namespace"),
        (ClaimRef("n" * 64, GOOD_UID, "c"), "claim.namespace"),
        (ClaimRef("ns", GOOD_UID, "a/b"), "claim.name"),
        (ClaimRef("ns", GOOD_UID, ".."), "claim.name"),
        (ClaimRef("ns", GOOD_UID, "n" * 254), "claim.name"),
    ],
)
def test_a_bad_namespace_or_name_is_refused_naming_the_field(ref: ClaimRef, field: str) -> None:
    with pytest.raises(BadName, match=field.replace(".", r"\.")):
        check_claim_ref(ref)


@pytest.mark.parametrize("value", ["..", ".", ".hidden", "-x", "a/b", "a\x00b", "", "x" * 129])
def test_a_path_component_never_leaves_its_directory(value: str) -> None:
    with pytest.raises(BadName, match="mps key"):
        check_path_component(value, "mps key")


def test_a_daemon_key_shape_is_a_valid_path_component() -> None:
    assert check_path_component(f"{GOOD_UID}-a1b2c", "mps key") == f"{GOOD_UID}-a1b2c"
    assert check_path_component("shares-0123456789ab", "mps key") == "shares-0123456789ab"
