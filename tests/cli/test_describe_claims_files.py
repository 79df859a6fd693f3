"""`describe --claims FILE` (and `--device-classes FILE`) read as config files are read:
regular files only, a size cap checked before reading, the config loader's bounds on the
YAML; anything else is exit 2 and one `error:` line naming the file, never a hang or a
traceback.

The issue's cases run the real `python -m gpuslice` (what a user sees); the whole
hostile-config corpus runs through click's runner, in-process, to keep it cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslice.cli.describe import MAX_CLAIMS_BYTES
from gpuslice.cli.main import main
from gpuslice.testing.hostile_configs import HOSTILE
from gpuslice.whatif.claims import load_claims

NODE = "sim:1xh100-80gb"
DEEP = 100_000
CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: c
  annotations: {{since: 2001-02-30, until: 2001-02-28}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}
"""


def run_cli(*args: str) -> tuple[int, str, str]:
    """The installed CLI in a child process; the timeout is what makes a hang a failure."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuslice", *args],
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
        env={**os.environ, "COLUMNS": "140"},
    )
    return proc.returncode, proc.stdout, proc.stderr


def fifo(path: Path) -> None:
    os.mkfifo(path)


def sparse_300_mb(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(300 * 1024 * 1024)


def flow_nested(path: Path) -> None:
    path.write_text("[" * DEEP + "]" * DEEP, encoding="utf-8")


def block_nested(path: Path) -> None:
    path.write_text("- " * DEEP + "x\n", encoding="utf-8")


def directory(path: Path) -> None:
    path.mkdir()


def symlink_loop(path: Path) -> None:
    path.symlink_to(path.name + ".other")
    path.with_name(path.name + ".other").symlink_to(path.name)


def not_an_integer(path: Path) -> None:
    path.write_text(CLAIM.format(count="2001-02-30"), encoding="utf-8")


ISSUE_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (fifo, "it is a FIFO, not a regular file"),
    "300-MB-sparse": (
        sparse_300_mb,
        f"it is {300 * 1024 * 1024} bytes; at most {MAX_CLAIMS_BYTES} are read",
    ),
    "nested-100000-flow": (flow_nested, "nested more than 64 levels deep"),
    "nested-100000-block": (block_nested, "nested more than 64 levels deep"),
    "date-as-count": (not_an_integer, "count: must be an integer, got '2001-02-30'"),
    "directory": (directory, "it is a directory, not a regular file"),
    "symlink-loop": (symlink_loop, "cannot read it: Too many levels of symbolic links"),
}


def assert_one_error_line(code: int, out: str, err: str, path: Path, reason: str) -> None:
    assert "Traceback" not in err, err
    assert code == 2, err
    assert out == ""
    assert err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: {path}: "), err
    assert reason in err, err


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_the_issues_claims_files_are_one_error_line_and_exit_2(tmp_path: Path, case: str) -> None:
    make, reason = ISSUE_CASES[case]
    path = tmp_path / "claims.yaml"
    make(path)
    code, out, err = run_cli("describe", "--node", NODE, "--claims", str(path))
    assert_one_error_line(code, out, err, path, reason)


@pytest.mark.parametrize("case", ["fifo", "directory", "nested-100000-flow"])
def test_a_device_classes_file_is_read_the_same_way(tmp_path: Path, case: str) -> None:
    make, reason = ISSUE_CASES[case]
    claims = tmp_path / "claims.yaml"
    claims.write_text(CLAIM.format(count=1), encoding="utf-8")
    classes = tmp_path / "classes.yaml"
    make(classes)
    args = ("--claims", str(claims), "--device-classes", str(classes))
    code, out, err = run_cli("describe", "--node", NODE, *args)
    assert_one_error_line(code, out, err, classes, reason)


def test_dates_stay_strings_as_kubernetes_reads_them(tmp_path: Path) -> None:
    """`2001-02-30` in an annotation is no date at all to Kubernetes (its YAML reader
    passes date-like scalars on as strings), so the claim is read and allocated."""
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIM.format(count=1), encoding="utf-8")
    (claim,) = load_claims(path.read_text(encoding="utf-8"))
    assert claim["metadata"]["annotations"] == {"since": "2001-02-30", "until": "2001-02-28"}
    code, out, err = run_cli("describe", "--node", NODE, "--claims", str(path), "-o", "json")
    assert (code, err) == (0, "")
    assert [c["fits"] for c in json.loads(out)["claims"]] == [True]


@pytest.mark.parametrize("name", sorted(set(HOSTILE) - {"50-MB-file"}))
def test_every_hostile_config_at_the_claims_path_is_refused(tmp_path: Path, name: str) -> None:
    """The fault suite's corpus (the 50 MB file is the sparse 300 MB case above)."""
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIM.format(count=1), encoding="utf-8")
    HOSTILE[name](path)
    result = CliRunner().invoke(main, ["describe", "--node", NODE, "--claims", str(path)])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, path, "")
