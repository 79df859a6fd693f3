"""CDI spec files and the checkpoint file: names, atomic replacement, idempotent removal."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile, boot_id

KIND = "k8s.gpuslice.io/claim"
UID = "0b6c0a1e-3f4f-4b8e-9a59-1f0c2f1d2a3b"


def spec(device: str = "gpu-0") -> dict[str, object]:
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [{"name": f"{UID}-{device}", "containerEdits": {"env": ["A=1"]}}],
    }


def test_spec_file_is_named_like_a_cdi_transient_spec_and_reads_back(tmp_path: Path) -> None:
    store = CdiSpecStore(tmp_path, KIND)
    path = store.write(UID, spec())
    assert path == tmp_path / f"k8s.gpuslice.io-claim_{UID}.yaml"
    assert yaml.safe_load(path.read_text()) == spec()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert store.claims() == {UID}


def test_rewrite_replaces_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = CdiSpecStore(tmp_path, KIND)
    store.write(UID, spec("gpu-0"))
    store.write(UID, spec("gpu-1"))
    assert [p.name for p in tmp_path.iterdir()] == [f"k8s.gpuslice.io-claim_{UID}.yaml"]
    assert "gpu-1" in store.path_for(UID).read_text()


def test_remove_is_idempotent_and_other_specs_are_left_alone(tmp_path: Path) -> None:
    foreign = tmp_path / "nvidia.yaml"
    foreign.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    store = CdiSpecStore(tmp_path, KIND)
    store.write(UID, spec())
    assert store.remove(UID) is True
    assert store.remove(UID) is False
    assert foreign.exists()
    assert store.claims() == set()


@pytest.mark.parametrize("uid", ["", "../x", ".hidden", "a/b"])
def test_a_uid_that_cannot_name_a_file_is_refused(tmp_path: Path, uid: str) -> None:
    with pytest.raises(ValueError, match="cannot name a CDI spec file"):
        CdiSpecStore(tmp_path, KIND).path_for(uid)


def test_a_spec_of_another_kind_is_refused(tmp_path: Path) -> None:
    other = dict(spec(), kind="nvidia.com/gpu")
    with pytest.raises(ValueError, match="not this store's"):
        CdiSpecStore(tmp_path, KIND).write(UID, other)


def test_checkpoint_round_trip_private_and_quarantine(tmp_path: Path) -> None:
    cp = CheckpointFile(tmp_path / "state" / "checkpoint.json")
    assert cp.read() is None
    cp.write(b'{"a": 1}')
    assert cp.read() == b'{"a": 1}'
    assert oct(cp.path.stat().st_mode & 0o777) == "0o600"
    moved = cp.quarantine()
    assert moved is not None
    assert moved.name.startswith("checkpoint.json.corrupt-")
    assert moved.read_bytes() == b'{"a": 1}'
    assert cp.read() is None
    assert cp.quarantine() is None


def test_replace_keeping_leaves_a_record_at_the_path_at_every_step(tmp_path: Path) -> None:
    """The old bytes are linked aside before the new ones replace them; what cannot be
    linked (a directory) is moved aside; whatever was there is kept, never followed."""
    cp = CheckpointFile(tmp_path / "record.json")
    assert cp.replace_keeping(b"new") is None  # nothing there: nothing kept
    kept = cp.replace_keeping(b"newer")
    assert kept is not None
    assert (kept.read_bytes(), cp.read()) == (b"new", b"newer")
    assert cp.replace_keeping(b"newest") != kept  # a kept name is never reused
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not ours")
    cp.path.unlink()
    cp.path.symlink_to(target)
    kept = cp.replace_keeping(b"after a symlink")
    assert kept is not None
    assert kept.is_symlink()
    assert (target.read_bytes(), cp.read()) == (b"not ours", b"after a symlink")
    cp.path.unlink()
    cp.path.mkdir()
    kept = cp.replace_keeping(b"after a directory")
    assert kept is not None
    assert kept.is_dir()
    assert cp.read() == b"after a directory"


def test_boot_id(tmp_path: Path) -> None:
    f = tmp_path / "boot_id"
    f.write_text("3c1f0f2e-aaaa-bbbb-cccc-000000000000\n")
    assert boot_id(f) == "3c1f0f2e-aaaa-bbbb-cccc-000000000000"
    assert boot_id(tmp_path / "missing") == ""
    assert boot_id() != ""  # this machine's own
