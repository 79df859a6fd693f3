#!/usr/bin/env python3
"""The Kubernetes API double (`gpuslice.testing.apiserver`) in its own process, for the DRA
benches.

A real driver's API server is another machine; in the driver's process the double's
request handling (JSON, copies, its own thread) would compete for the driver's GIL and be
charged to it. So the benches start this script as a child and drive it over stdin/stdout
with one JSON object a line, answered by one JSON object a line (untimed, between
measurements):

    {"op": "node", "name": N}                          -> {"uid": ...}
    {"op": "device_class", "obj": {...}}               -> {}
    {"op": "claim", "obj": {...}, "status": {...}}     -> {"uid": ...}  (created, then allocated)
    {"op": "count"}                                    -> {"count": requests served so far}
    {"op": "requests", "since": K}                     -> {"requests": ["GET /path", ...]}
    {"op": "wipe", "node": N, "driver": D}             -> {"deleted": K}  (the kubelet's wipe)
    {"op": "slices", "node": N, "driver": D}           -> {"slices": [[name, generation,
                                                           devices, tainted devices], ...]}

The first line it prints is {"url": ...}; it stops when stdin closes.

TCP_NODELAY: the double's handler writes a response's headers and body in two sends; with
Nagle's algorithm on (socketserver's default) the body waits for the client's delayed ACK
of the headers, about 40 ms on Linux, on every request of a kept-alive connection. A real
API server (Go's net package) sets TCP_NODELAY on every connection, so this process does
too (`disable_nagle_algorithm`), or every API round trip here would be that stall. (The
double's handler now sets it itself; this keeps the benches right on older trees.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuslice.core.jsontypes import Json
from gpuslice.testing import apiserver
from gpuslice.testing.apiserver import running_apiserver


def _serve() -> None:
    apiserver._Handler.disable_nagle_algorithm = True
    with running_apiserver() as api:
        print(json.dumps({"url": api.url}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            out: Json
            if op == "node":
                out = {"uid": api.add_node(cmd["name"])["metadata"]["uid"]}
            elif op == "device_class":
                api.add_device_class(cmd["obj"])
                out = {}
            elif op == "claim":
                created = api.add_claim(cmd["obj"])
                meta = created["metadata"]
                api.set_claim_status(meta["namespace"], meta["name"], cmd["status"])
                out = {"uid": meta["uid"]}
            elif op == "count":
                out = {"count": len(api.requests)}
            elif op == "requests":
                out = {"requests": [f"{r.method} {r.path}" for r in api.requests[cmd["since"] :]]}
            elif op == "wipe":
                out = {"deleted": api.delete_all_slices(cmd["node"], cmd["driver"])}
            elif op == "slices":
                out = {
                    "slices": [
                        [
                            s["metadata"]["name"],
                            s["spec"]["pool"]["generation"],
                            len(s["spec"]["devices"]),
                            sum(1 for d in s["spec"]["devices"] if d.get("taints")),
                        ]
                        for s in api.resource_slices(cmd["node"], cmd["driver"])
                    ]
                }
            else:
                out = {"error": f"unknown op {op!r}"}
            print(json.dumps(out), flush=True)


class ApiDouble:
    """The parent's handle on the child: `call(op, **fields)` and `kubeconfig`."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url: str = self._read()["url"]

    def _read(self) -> Json:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise SystemExit("the API double process ended")
        out: Json = json.loads(line)
        if "error" in out:
            raise SystemExit(f"API double: {out['error']}")
        return out

    def call(self, op: str, **fields: Any) -> Json:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def kubeconfig(self) -> Json:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": {"token": "bench"}}],
            "contexts": [
                {
                    "name": "double",
                    "context": {"cluster": "double", "user": "double", "namespace": "default"},
                }
            ],
            "current-context": "double",
        }

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(10)

    def __enter__(self) -> ApiDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    _serve()
