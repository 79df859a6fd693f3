"""`advise --prometheus` on slow or empty ground: it stops at the first answer that shows
there is nothing to read (it used to make every range request first: 45 s of silence on a
week of a large Prometheus, then "no series"), and on a terminal it says what it is reading
while it reads (in a pipe, stderr stays for the one `error:` line). Against the loopback
Prometheus impostor of `hostile.py`."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from http.server import BaseHTTPRequestHandler

import pytest

from tests.core.advise.advise_cases import run
from tests.core.advise.hostile import UNTIL, answer, history, impostor, send

WINDOW = ("--until", str(UNTIL), "--since", "7d")


def empty(h: BaseHTTPRequestHandler) -> None:
    """A Prometheus that scrapes no gpuslice exporter."""
    send(h, answer("matrix" if "query_range" in h.path else "vector", []))


@pytest.mark.timeout(60)
def test_nothing_to_read_stops_after_the_first_request() -> None:
    with impostor(empty) as prom:
        code, _, err = run("advise", "--prometheus", prom.url, *WINDOW)
        asked = list(prom.paths)
    assert code == 2, err
    assert err.startswith("error: no gpuslice_pod_memory_used_bytes series in the range "), err
    assert "metrics.serviceMonitor.enabled" in err
    assert len(asked) == 1, asked


def on_a_terminal(*args: str) -> tuple[int, str]:
    """Runs `python -m gpuslice` with its stderr on a pseudo-terminal; what it wrote there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuslice", *args],
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    return proc.wait(timeout=30), out.decode(errors="replace")


@pytest.mark.timeout(60)
def test_on_a_terminal_it_says_what_it_reads() -> None:
    with impostor(history()) as prom:
        code, err = on_a_terminal("advise", "--prometheus", prom.url, *WINDOW, "-o", "json")
    assert code == 0, err
    assert f"asking Prometheus at {prom.url} for pods' GPU memory in the range" in err
    assert "1 pod series; reading them in 11 requests" in err
    assert "request 1/11: gpuslice_pod_memory_used_bytes" in err
    assert "request 11/11: DCGM_FI_DEV_FB_FREE" in err
    # in a pipe (a script, CI), stderr stays for the one `error:` line
    with impostor(history()) as prom:
        piped = subprocess.run(
            [sys.executable, "-m", "gpuslice", "advise", "--prometheus", prom.url, *WINDOW],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert piped.returncode == 0, piped.stderr
    assert "asking Prometheus" not in piped.stderr
