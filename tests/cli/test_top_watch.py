"""`gpuslice top --watch` where there is no terminal (`kubectl exec` without `-t`, a pipe):
each refresh arrives as it happens (a live view printed nothing until interrupted), and
with `-o json` / `-o yaml` it streams one document per refresh (it used to ignore -w).

The real `python -m gpuslice top` against a stand-in agent's `/status` on port 0, its stdout
read through a pipe while it runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

import pytest
import yaml

from gpuslice.core.jsontypes import Json

NODE = "gpu-node-7"


def status(n: int) -> Json:
    return {
        "version": 1,
        "node_name": NODE,
        "config_name": None,
        "snapshot_taken_at": None,
        "resources": [],
        "gpus": [],
        "pods": [],
        "warnings": [f"frame {n}"],
    }


@pytest.fixture
def agent_url() -> Iterator[str]:
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served[0] += 1
            body = json.dumps(status(served[0])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def watching(url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuslice", "top", "--url", url, "-w", "0.2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines_until(out: IO[str], enough: int, match: str) -> list[str]:
    """Lines read as they arrive, until `enough` of them contain `match`; the watch is still
    running, so what is read here was written and flushed while it ran."""
    seen: list[str] = []
    while sum(match in line for line in seen) < enough:
        line = out.readline()
        assert line, f"top ended early: {''.join(seen)}"
        seen.append(line)
    return seen


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


@pytest.mark.timeout(60)
def test_watch_without_a_terminal_prints_each_frame(agent_url: str) -> None:
    proc = watching(agent_url)
    assert proc.stdout is not None
    try:
        seen = lines_until(proc.stdout, 2, NODE)
    finally:
        stop(proc)
    text = "".join(seen)
    assert "warning: frame 1" in text
    assert text.count(NODE) == 2


@pytest.mark.timeout(60)
def test_watch_with_json_streams_one_document_per_line(agent_url: str) -> None:
    proc = watching(agent_url, "-o", "json")
    assert proc.stdout is not None
    try:
        first, second = (json.loads(proc.stdout.readline()) for _ in range(2))
    finally:
        stop(proc)
    assert (first["node_name"], second["node_name"]) == (NODE, NODE)
    assert first["warnings"] != second["warnings"], "the second is a fresh /status"


@pytest.mark.timeout(60)
def test_watch_with_yaml_streams_documents(agent_url: str) -> None:
    proc = watching(agent_url, "-o", "yaml")
    assert proc.stdout is not None
    try:
        seen = lines_until(proc.stdout, 3, "---")
    finally:
        stop(proc)
    docs = [d for d in yaml.safe_load_all("".join(seen[:-1])) if d]
    assert len(docs) >= 2
    assert all(d["node_name"] == NODE for d in docs)
