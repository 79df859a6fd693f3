"""The NFD features.d file: atomic replacement, unchanged content left alone, removal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.host.labelfile import LabelFile, render


def test_writes_sorted_key_value_lines(tmp_path: Path) -> None:
    path = tmp_path / "features.d" / "gfd"
    assert LabelFile(path).write({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2"})
    assert path.read_text() == "nvidia.com/gpu.count=2\nnvidia.com/gpu.replicas=4\n"


def test_replacement_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    labels = LabelFile(path)
    labels.write({"a": "1" * 1000})
    with path.open() as reader:  # a reader holding the old file sees it whole
        labels.write({"b": "2"})
        assert reader.read() == "a=" + "1" * 1000 + "\n"
    assert path.read_text() == "b=2\n"
    assert sorted(os.listdir(tmp_path)) == ["gfd"]  # no temp file left behind


def test_unchanged_labels_do_not_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    labels = LabelFile(path)
    assert labels.write({"a": "1"})
    inode = path.stat().st_ino
    assert not labels.write({"a": "1"})
    assert path.stat().st_ino == inode


def test_remove(tmp_path: Path) -> None:
    labels = LabelFile(tmp_path / "gfd")
    labels.write({"a": "1"})
    labels.remove()
    assert not (tmp_path / "gfd").exists()
    labels.remove()  # idempotent


def test_rejects_values_that_would_break_the_format() -> None:
    with pytest.raises(ValueError, match="one key=value line"):
        render({"a": "x\ny=z"})
