"""Every command with bad input: exit 2, an `error:` line naming the real cause, no traceback.

Runs the real `python -m gpuslice` (no CliRunner), so what is asserted is what a user sees."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BAD_CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 0
"""
CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}
data:
  any: |-
    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: 4
"""
NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: gpu-operator\n"


def gpuslice(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuslice", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stderr


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "bad": tmp_path / "bad.yaml",
        "two-maps": tmp_path / "two.yaml",
        "ns-and-map": tmp_path / "ns.yaml",
        "nodes": tmp_path,
    }
    out["bad"].write_text(BAD_CONFIG)
    out["two-maps"].write_text(CONFIGMAP.format(name="a") + "---\n" + CONFIGMAP.format(name="b"))
    out["ns-and-map"].write_text(NAMESPACE + "---\n" + CONFIGMAP.format(name="tsc"))
    return out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CASES: list[tuple[str, list[str], str]] = [
    (
        "describe bad config",
        ["describe", "--node", "sim:1xt4", "--config-file", "{bad}"],
        "replicas: must be >= 1, got 0",
    ),
    ("describe bad node", ["describe", "--node", "sim:2xbogus"], "bogus"),
    (
        "describe missing name",
        [
            "describe",
            "--node",
            "sim:1xt4",
            "--config-file",
            "{ns-and-map}",
            "--config-name",
            "a100",
        ],
        "--config-name / CONFIG_NAME: config a100 does not exist",
    ),
    (
        "describe name without file",
        ["describe", "--node", "sim:1xt4", "--config-name", "a100"],
        "no --config-file",
    ),
    (
        "describe two configmaps",
        ["describe", "--node", "sim:1xt4", "--config-file", "{two-maps}"],
        "several hold named configs",
    ),
    (
        "labels bad config",
        ["labels", "--node", "sim:1xt4", "--config-file", "{bad}"],
        "replicas: must be >= 1",
    ),
    ("labels bad node", ["labels", "--node", "sim:0xt4"], "'0xt4': count: must be at least 1"),
    ("demo bad config", ["demo", "--config-file", "{bad}"], "replicas: must be >= 1, got 0"),
    ("demo bad node", ["demo", "--node", "sim:2xnope"], "nope"),
    (
        "plugin bad config",
        [
            "plugin",
            "--node",
            "sim:1xt4",
            "--config-file",
            "{bad}",
            "--device-plugin-path",
            "{nodes}",
            "--no-labels",
        ],
        "replicas: must be >= 1",
    ),
    (
        "top unreachable",
        ["top", "--url", "http://127.0.0.1:{port}"],
        "cannot reach the gpuslice daemon",
    ),
    ("top not a url", ["top", "--url", "nowhere"], "cannot reach the gpuslice daemon at nowhere"),
]


@pytest.mark.parametrize(("args", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_and_exit_2(
    files: dict[str, Path], args: list[str], cause: str
) -> None:
    values = {k: str(v) for k, v in files.items()} | {"port": str(closed_port())}
    code, err = gpuslice(*(a.format(**values) for a in args))
    assert "Traceback" not in err, err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.lower().startswith("error:")]
    assert errors, err
    assert cause in err, err


def test_a_namespace_and_a_configmap_in_one_file_is_the_configmap(
    files: dict[str, Path],
) -> None:
    code, err = gpuslice(
        "describe", "--node", "sim:1xt4", "--config-file", str(files["ns-and-map"])
    )
    assert code == 0, err


def test_a_simulated_plugin_writes_no_labels_unless_told(tmp_path: Path) -> None:
    """`gpuslice plugin --node sim:...` must not touch the real NFD directory: with no
    --labels-file it says labels are off (and then runs; SIGTERM ends it)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuslice",
            "plugin",
            "--node",
            "sim:1xt4",
            "--device-plugin-path",
            str(tmp_path),
            "--kubelet-socket",
            "",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        seen = ""
        for line in proc.stderr:
            seen += line
            if "event=labels-off" in line or "event=labels-written" in line:
                break
        assert "event=labels-off reason=simulated-node" in seen, seen
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
