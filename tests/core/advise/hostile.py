"""A Prometheus impostor on loopback for advise's hardening tests: an http.server in a
thread whose every answer a test writes (a good history, a drip feed, a redirect, a
gigabyte), and a child-process runner that reports the command's peak memory."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

UNTIL = 1_764_000_000.0
"""The end of every history served here (a fixed time: the impostor ignores the range)."""
STEP = 15.0
GIB = 1024**3

Handler = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Impostor:
    url: str
    stop: threading.Event
    respond: Handler
    paths: list[str] = field(default_factory=list)


def send(h: BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def answer(result_type: str, result: list[object]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": result_type, "result": result}}
    ).encode()


def pod(name: str = "train") -> dict[str, str]:
    return {"namespace": "ml", "pod": name, "container": "main", "UUID": "GPU-1"}


def memory_points(n: int = 40, mib: int = 9216) -> list[list[object]]:
    """A pod holding `mib` for the last `n` steps before UNTIL, as Prometheus writes them."""
    return [[UNTIL - (n - i) * STEP, str(mib * 1024 * 1024)] for i in range(n)]


def history(
    memory: list[list[object]] | None = None,
    *,
    model: str = "NVIDIA H100 80GB HBM3",
    fb: tuple[str, str] = ("1000", "80000"),
    pod_name: str = "train",
) -> Handler:
    """A well-formed Prometheus holding one pod on one GPU; `memory` replaces its points."""
    values = memory_points() if memory is None else memory

    def respond(h: BaseHTTPRequestHandler) -> None:
        query = parse_qs(urlsplit(h.path).query).get("query", [""])[0]
        if "gpuslice_pod_memory_used_bytes" in query:
            send(h, answer("matrix", [{"metric": pod(pod_name), "values": values}]))
        elif "DCGM_FI_DEV_FB" in query:
            used = "USED" in query
            gpu = {"UUID": "GPU-1", "modelName": model}
            send(h, answer("vector", [{"metric": gpu, "value": [UNTIL, fb[0 if used else 1]]}]))
        else:
            send(h, answer("matrix" if "query_range" in h.path else "vector", []))

    return respond


@contextmanager
def impostor(respond: Handler) -> Iterator[Impostor]:
    """Serves `respond` (replaceable through the yielded object) until the block ends."""
    stop = threading.Event()

    class Handle(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.paths.append(self.path)
            # advise hangs up past its limits, as it should
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                served.respond(self)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    httpd.daemon_threads = True
    served = Impostor(f"http://127.0.0.1:{httpd.server_address[1]}", stop, respond)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()


@dataclass(frozen=True)
class ChildRun:
    code: int
    stderr: str
    peak_rss_mib: float


REPORTS_HWM = """
import atexit, os, runpy, sys

def report():
    with open("/proc/self/status") as status:
        hwm = next(line for line in status if line.startswith("VmHWM:"))
    with open(os.environ["GPUSLICE_TEST_HWM"], "w") as out:
        out.write(hwm.split()[1])

atexit.register(report)
sys.argv[0] = "gpuslice"
runpy.run_module("gpuslice", run_name="__main__")
"""
"""Runs `python -m gpuslice` and writes its VmHWM at exit: the peak RSS of the process
as it is after exec. `wait4`'s ru_maxrss would not do: Linux carries the forking
parent's RSS over the exec, and the test process holds the impostor's answers."""


def run_child(*args: str, tmp: Path, address_space: int = 2 * GIB) -> ChildRun:
    """`python -m gpuslice` in a child process held to `address_space` (so an unbounded
    read fails there instead of taking the machine), with its own peak RSS. A hang is
    pytest-timeout's to report."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    hwm = tmp / "vmhwm"
    proc = subprocess.run(
        [sys.executable, "-c", REPORTS_HWM, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=limit,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "GPUSLICE_TEST_HWM": str(hwm),
        },
        check=False,
    )
    peak = int(hwm.read_text()) / 1024 if hwm.exists() else float("nan")
    return ChildRun(proc.returncode, proc.stderr.decode(errors="replace"), peak)
