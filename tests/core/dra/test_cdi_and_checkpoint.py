"""The per-claim CDI spec, and the checkpoint's encoding across upgrades, corruption and
reboots."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.core.cdi.spec import CdiDevice, MpsMounts
from gpuslice.core.dra.cdispec import cdi_id, claim_spec
from gpuslice.core.dra.kubelet_api import PreparedDevice
from gpuslice.core.dra.prepared import (
    FORMAT,
    INCOMPLETE_FORMAT,
    AppliedSharing,
    Checkpoint,
    PreparedClaim,
    decode,
    encode,
)

UID = "4f1c8a2e-0000-4000-8000-000000000001"


def test_claim_spec_edits_and_lowest_version() -> None:
    spec = claim_spec(UID, [CdiDevice("gpu-0", "GPU-a", 0), CdiDevice("gpu-1", "GPU-b", 1)])
    assert spec["kind"] == "k8s.gpuslice.io/claim"
    assert spec["cdiVersion"] == "0.5.0"  # names start with the UID's digit
    first = spec["devices"][0]
    assert first["name"] == f"{UID}-gpu-0"
    # two devices of one request (a claim of count 2): each names both, so whichever the
    # runtime applies last, the container sees both
    assert first["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]
    assert first["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    letters = claim_spec("abc", [CdiDevice("gpu-0", "GPU-a", 0)])
    assert letters["cdiVersion"] == "0.3.0"
    assert cdi_id(UID, "gpu-0") == f"k8s.gpuslice.io/claim={UID}-gpu-0"


def test_mps_devices_get_the_daemons_pipe_and_shm() -> None:
    mps = MpsMounts("/run/nvidia/mps/c1/pipe", "/run/nvidia/mps/c1/shm")
    [device] = claim_spec(UID, [CdiDevice("gpu-0", "GPU-a", 0, mps=mps)])["devices"]
    edits = device["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        ("/run/nvidia/mps/c1/pipe", "/tmp/nvidia-mps"),
        ("/run/nvidia/mps/c1/shm", "/dev/shm"),
        ("/dev/null", "/var/run/nvidia-container-devices/GPU-a"),
    ]


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="not a valid CDI device name"):
        cdi_id(UID, "gpu 0")
    with pytest.raises(ValueError, match="at least one device"):
        claim_spec(UID, [])


CLAIM = PreparedClaim(
    uid=UID,
    namespace="ml",
    name="shared-gpu",
    state="PrepareCompleted",
    devices=(PreparedDevice(("mps-gpu",), "n1", "gpu-0", (f"k8s.gpuslice.io/claim={UID}-gpu-0",)),),
    applied=(AppliedSharing("MPS", ("GPU-a",), mps_key="claim-4f1c8a2e"),),
)


def test_round_trip_and_boot_id() -> None:
    raw = encode(Checkpoint("boot-1", {UID: CLAIM}))
    got = decode(raw, "boot-1")
    assert got.status == "ok"
    assert got.checkpoint.claims == {UID: CLAIM}
    after_reboot = decode(raw, "boot-2")
    assert after_reboot.status == "stale"
    assert after_reboot.checkpoint.claims == {}
    assert decode(None, "boot-1").status == "empty"


def test_a_file_from_a_newer_version_with_extra_fields_still_reads() -> None:
    doc = json.loads(encode(Checkpoint("b", {UID: CLAIM})))
    doc["data"]["claims"][UID]["devices"][0]["metadata"] = {"future": True}
    doc["data"]["newTopLevel"] = [1, 2]
    doc["version"] = 7
    from gpuslice.core.dra.prepared import _checksum

    doc["checksum"] = _checksum(doc["data"])  # the newer writer's checksum over its data
    got = decode(json.dumps(doc).encode(), "b")
    assert got.status == "ok"
    assert got.checkpoint.claims[UID] == CLAIM


def test_a_record_rebuilt_without_the_api_says_it_is_incomplete() -> None:
    """Kept across restarts, so a later start rebuilds again instead of trusting it. It
    says so with its format name, which no earlier reader accepts (they would read a field
    inside the old format as complete: tests/e2e_dra/test_dra_rollback.py); a complete
    record is written as it always was."""
    incomplete = encode(Checkpoint("b", {UID: CLAIM}, complete=False))
    assert json.loads(incomplete)["format"] == INCOMPLETE_FORMAT != FORMAT
    got = decode(incomplete, "b")
    assert (got.status, got.checkpoint.complete) == ("ok", False)
    assert got.checkpoint.claims == {UID: CLAIM}
    complete = encode(Checkpoint("b", {UID: CLAIM}))
    assert json.loads(complete)["format"] == FORMAT
    assert "incomplete" not in json.loads(complete)["data"]
    assert decode(complete, "b").checkpoint.complete
    from gpuslice.core.dra.prepared import _checksum

    # how the release before the format name said it: still read as incomplete
    doc = json.loads(complete)
    doc["data"]["incomplete"] = True
    doc["checksum"] = _checksum(doc["data"])
    assert not decode(json.dumps(doc).encode(), "b").checkpoint.complete
    doc["data"]["incomplete"] = "yes"  # not `true`: read as complete, never raised
    doc["checksum"] = _checksum(doc["data"])
    assert decode(json.dumps(doc).encode(), "b").checkpoint.complete


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe", "UnicodeDecodeError"),
        (b"{}", "not a gpuslice DRA checkpoint"),
        (b"[1]", "not a gpuslice DRA checkpoint"),
        (b"{\"format\": \"gpuslice.io/dra-checkpoint\", \"checksum\": \"x\", \"data\": {}}",
         "checksum mismatch"),
    ],
)  # fmt: skip
def test_corrupt_files_are_reported_not_raised(raw: bytes, reason: str) -> None:
    got = decode(raw, "b")
    assert got.status == "corrupt"
    assert reason in got.reason


def test_a_flipped_byte_is_a_checksum_mismatch() -> None:
    raw = encode(Checkpoint("b", {UID: CLAIM})).replace(b"shared-gpu", b"shared-gpv")
    assert decode(raw, "b").status == "corrupt"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_no_bytes_make_decode_raise(raw: bytes) -> None:
    assert decode(raw, "b").status in ("corrupt", "ok")


def test_device_nodes_under_another_dev_root_name_their_host_path() -> None:
    spec = claim_spec("abc", [CdiDevice("gpu-0", "GPU-a", 3)], host_dev_root="/run/nvidia/driver/")
    (device,) = spec["devices"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3", "hostPath": "/run/nvidia/driver/dev/nvidia3"}
    ]
    assert spec["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidiactl",
        "hostPath": "/run/nvidia/driver/dev/nvidiactl",
    }
    # a name that starts with a letter would allow 0.3.0; hostPath needs 0.5.0
    assert spec["cdiVersion"] == "0.5.0"


def test_device_nodes_in_the_hosts_dev_have_no_host_path() -> None:
    spec = claim_spec("abc", [CdiDevice("gpu-0", "GPU-a", 0)], host_dev_root="/")
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert all("hostPath" not in n for n in spec["containerEdits"]["deviceNodes"])
    assert spec["cdiVersion"] == "0.3.0"
