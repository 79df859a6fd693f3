"""`gpuslice plugin` refusing its settings at start: one `error:` line, exit 2, no traceback
and no usage block, naming the flag, its variable and the chart value that sets it (a chart
user set `metrics.port`, never `--metrics-port`). Ports included: a port out of range, the
probes' port equal to the metrics port, and a port another process holds.

Runs the real `python -m gpuslice plugin`, so what is asserted is what the pod's log shows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def plugin(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
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
            "--no-labels",
            "--no-compute-mode",
            "--pod-resources-socket",
            str(tmp_path / "none.sock"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stderr


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    assert "Usage:" not in err, err
    errors = [line for line in err.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith("error: "), err
    return errors[0]


METRICS = "--metrics-port (METRICS_PORT; chart value metrics.port)"

CASES: list[tuple[str, list[str], dict[str, str], list[str]]] = [
    ("port out of range", ["--metrics-port", "70000"], {}, [METRICS, "70000"]),
    (
        "port out of range from the chart",
        [],
        {"METRICS_PORT": "70000"},
        [METRICS, "70000"],
    ),
    (
        "metrics port is the health port",
        ["--metrics-port", "9555", "--health-port", "9555"],
        {},
        [METRICS, "--health-port (HEALTH_PORT; chart value probes.port)", "must differ"],
    ),
    (
        "a reserve the chart passed",
        [],
        {"MEMORY_GUARD_RESERVE": "4GB"},
        [
            "--memory-guard-reserve (MEMORY_GUARD_RESERVE; chart value memoryGuard.reserve)",
            "'4GB'",
        ],
    ),
    (
        "a choice from extraEnv",
        [],
        {"MEMORY_GUARD": "on"},
        ["--memory-guard (MEMORY_GUARD; chart value memoryGuard.mode)", "'on'"],
    ),
]


@pytest.mark.parametrize(
    ("args", "env", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_setting_is_one_line_naming_flag_variable_and_chart_value(
    tmp_path: Path, args: list[str], env: dict[str, str], named: list[str]
) -> None:
    code, err = plugin(tmp_path, *args, env=env)
    line = one_error_line(err)
    assert code == 2, err
    for name in named:
        assert name in line, line


def test_a_busy_metrics_port_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Under hostNetwork the port may be dcgm-exporter's: the agent says which port, why, and
    what sets it, and exits 2 (it used to end in a 55-line task-group traceback, exit 1)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = plugin(tmp_path, "--metrics-address", "127.0.0.1", "--metrics-port", str(port))
    line = one_error_line(err)
    assert code == 2, err
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line, line
    assert METRICS in line, line


def test_a_busy_health_port_names_the_probes_value(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = plugin(tmp_path, "--metrics-address", "127.0.0.1", "--health-port", str(port))
    line = one_error_line(err)
    assert code == 2, err
    assert "--health-port (HEALTH_PORT; chart value probes.port)" in line, line
