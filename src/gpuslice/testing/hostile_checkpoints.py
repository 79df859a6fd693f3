"""Things to find at the DRA checkpoint's path when the agent starts, as a disk, a crash or a
hand could leave them: each must end in a running agent that serves Prepare, with the bad
entry kept aside (`gpuslice-checkpoint.json.corrupt-<time>`).

Shared by `tests/e2e_dra/test_dra_checkpoint_corpus.py` and `bench/faults_checkpoint.py`.
Documents marked "sealed" carry a valid checksum, so only the decoder's own limits stop them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuslice.core.dra.prepared import sealed
from gpuslice.core.jsontypes import Json

UID = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"


def _claim(**over: Any) -> Json:
    claim: Json = {
        "namespace": "team-a",
        "name": "pod-1-gpu",
        "state": "PrepareCompleted",
        "devices": [{"requests": ["gpu"], "pool": "n1", "device": "gpu-0", "cdiIDs": []}],
        "uses": [{"device": "gpu-0", "physical": "GPU-0", "strategy": "mps", "sharedBy": 2}],
    }
    claim.update(over)
    return claim


def _data(uid: str = UID, **over: Any) -> Json:
    return {"bootID": "", "claims": {uid: _claim(**over)}}


def _sealed_text(data: Json, literal: tuple[str, str] | None = None) -> bytes:
    """`data` sealed; `literal` swaps a token in the text after sealing (a number JSON can
    write but Python's encoder would not write that way, such as `1e400`)."""
    raw = sealed(data)
    if literal is not None:
        raw = raw.replace(literal[0].encode(), literal[1].encode())
    return raw


def _write(content: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(content)

    return make


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("a directory where the file should be\n")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink_loop(path: Path) -> None:
    other = path.with_name(path.name + ".loop")
    other.symlink_to(path.name)
    path.symlink_to(other.name)


def _huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB of zeros that cost no disk


def _wrong_checksum() -> bytes:
    doc = json.loads(sealed(_data()))
    doc["checksum"] = "sha256:" + "0" * 64
    return json.dumps(doc).encode()


HOSTILE: dict[str, Callable[[Path], None]] = {
    "deep nesting (200,000 '[')": _write(b"[" * 200_000),
    "deep nesting inside a sealed document": _write(
        _sealed_text(_data(name="x"), ('"name":"x"', '"name":' + "[" * 50_000 + "]" * 50_000))
    ),
    "huge float, sealed (sharedBy 1e400)": _write(
        _sealed_text(
            _data(uses=[{"device": "g", "physical": "G", "sharedBy": float("inf")}]),
            ("Infinity", "1e400"),
        )
    ),
    "huge integer, sealed (sharedBy 10**400)": _write(
        _sealed_text(_data(uses=[{"device": "g", "physical": "G", "sharedBy": 10**400}]))
    ),
    "NaN, sealed": _write(
        _sealed_text(_data(applied=[{"strategy": "mps", "gpus": [], "interval": float("nan")}]))
    ),
    "wrong checksum": _write(_wrong_checksum()),
    "truncated": _write(sealed(_data())[:150]),
    "binary": _write(bytes(range(256)) * 64),
    "empty": _write(b""),
    "a directory": _directory,
    "a FIFO": _fifo,
    "a symlink loop": _symlink_loop,
    "100 MB": _huge,
    "path-hostile claim UID, sealed": _write(_sealed_text(_data(uid="../../../etc/x"))),
    "path-hostile MPS key, sealed": _write(
        _sealed_text(_data(applied=[{"strategy": "mps", "gpus": [], "mpsKey": "../../../tmp/x"}]))
    ),
}
"""What to put at the path, by what it is; each function creates the entry at its path."""
