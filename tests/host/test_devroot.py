"""The dev root decided as NVIDIA's `root.getDevRoot` does: a root holding `dev/` is one."""

from __future__ import annotations

from pathlib import Path

from gpuslice.host.devroot import container_dev_root, holds_dev, host_dev_root


def test_a_root_with_a_dev_directory_is_the_dev_root(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    assert holds_dev(str(tmp_path))
    assert container_dev_root(str(tmp_path)) == str(tmp_path)
    assert host_dev_root(str(tmp_path), "/run/nvidia/driver") == "/run/nvidia/driver"


def test_a_root_without_dev_or_missing_means_slash(tmp_path: Path) -> None:
    (tmp_path / "usr").mkdir()
    (tmp_path / "file-root").write_text("")
    for root in (tmp_path, tmp_path / "missing", tmp_path / "file-root"):
        assert container_dev_root(str(root)) == "/"
        assert host_dev_root(str(root), "/run/nvidia/driver") == "/"


def test_dev_as_a_file_is_not_a_dev_root(tmp_path: Path) -> None:
    (tmp_path / "dev").write_text("")
    assert not holds_dev(str(tmp_path))
