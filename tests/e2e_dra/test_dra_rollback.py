"""`helm rollback` to the previous release after a start without the API: the previous
release's own code (checked out of git) runs on the record this one wrote, with claims
running, and must lose none of them.

An agent that met a record it could not read while the API was down writes the record it
rebuilt as incomplete. The previous release ignores fields it does not know, so a record
that said so only with a field inside its format would read there as complete and empty:
it deleted every running claim's CDI spec and quit their MPS daemons. Written under a
format name it does not know, the previous release sets it aside and rebuilds, as it does
with any record it cannot read.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from gpuslice.core.dra.prepared import Checkpoint, PreparedClaim, encode
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from tests.e2e_dra.dra_node import DRIVER, claim_obj, opaque, request, running_dra_node

PREVIOUS_RELEASE = "a7f2648"
"""The main-line commit before the record could be incomplete (b4389fe added the field): the
release a rollback meets whose reader knows nothing of it. Later releases up to this change
read the field; `OLDER_READERS` holds them to refusing the new format too."""
OLDER_READERS = (PREVIOUS_RELEASE, "1a8cfeb")
"""1a8cfeb: the commit before the incomplete record got its own format name."""
REPO = Path(__file__).resolve().parents[2]
NVIDIA = "resource.nvidia.com/v1beta1"
MPS = {"apiVersion": NVIDIA, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
UID = "4f1c8a2e-0000-4000-8000-000000000002"


def previous_release(into: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """An earlier release's `src` tree, from git (skipped outside a git checkout)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit, "src"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"release {commit} is not in a git checkout: {exc}")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


OLD_DECODE = """
import sys
from gpuslice.core.dra.prepared import decode
got = decode(sys.stdin.buffer.read(), "boot-1")
print(got.status, len(got.checkpoint.claims), getattr(got.checkpoint, "complete", True))
"""


@pytest.mark.parametrize("commit", OLDER_READERS)
def test_an_older_reader_refuses_an_incomplete_record_and_so_rebuilds(
    tmp_path: Path, commit: str
) -> None:
    """Read by an older release's own decode: unreadable (it moves the file aside and
    rebuilds from the API and the node's CDI specs), never a record it trusts; a complete
    record still reads there as it always did."""
    src = previous_release(tmp_path, commit)
    claim = PreparedClaim(UID, "ml", "c", "PrepareCompleted")

    def old_decode(raw: bytes) -> str:
        done = subprocess.run(
            [sys.executable, "-c", OLD_DECODE],
            input=raw,
            capture_output=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(src)},
        )
        return done.stdout.decode().strip()

    assert old_decode(encode(Checkpoint("boot-1", {}, complete=False))).startswith("corrupt ")
    assert old_decode(encode(Checkpoint("boot-1", {UID: claim}))) == "ok 1 True"


def pid_of(pipe: Path) -> int:
    return int((pipe / "nvidia-cuda-mps-control.pid").read_text().strip())


def runs_from(pid: int, src: Path) -> bool:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return f"PYTHONPATH={src}".encode() in environ


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_rollback_after_an_api_less_start_keeps_running_claims(
    sock_dir: Path, api: FakeApiServer
) -> None:
    old_src = previous_release(sock_dir / "previous")
    async with running_dra_node(sock_dir, api, node="sim:2xh100-80gb") as node:
        mps = node.allocate(
            claim_obj("mps", [request("gpu")], [opaque(MPS)]), devices={"gpu": "gpu-0"}
        )
        plain = node.allocate(claim_obj("plain", [request("gpu")]), devices={"gpu": "gpu-1"})
        results = await node.prepare(mps, plain)
        assert [r.error for r in results.values()] == ["", ""]
        pipe = next((node.plugin_dir / "mps").glob(f"{mps.uid}-*/pipe"))
        pid = pid_of(pipe)
        specs = {p.name for p in node.cdi_root.iterdir()}
        assert len(specs) == 2

        # a corrupt record met with the API down: the rebuilt record is incomplete
        assert await node.daemon.terminate() == 0, node.daemon.log()
        record = node.plugin_dir / "gpuslice-checkpoint.json"
        record.write_bytes(record.read_bytes()[:40])
        kubeconfig = sock_dir / "kubeconfig"
        working = kubeconfig.read_text(encoding="utf-8")
        dead = yaml.safe_load(working)
        dead["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{free_port()}"
        kubeconfig.write_text(yaml.safe_dump(dead), encoding="utf-8")
        await node.daemon.start()
        await node.wait(
            lambda: node.log().count("dra-checkpoint-loaded") == 2, "the record rebuilt"
        )
        assert await node.daemon.terminate() == 0, node.daemon.log()
        assert {p.name for p in node.cdi_root.iterdir()} == specs

        # helm rollback, the API back: the previous release's agent on that record
        kubeconfig.write_text(working, encoding="utf-8")
        node.daemon = DaemonProcess(
            node.daemon.args,
            log_path=sock_dir / "previous.log",
            env={**node.daemon.env, "PYTHONPATH": str(old_src)},
        )
        await node.daemon.start()
        await node.wait(lambda: "dra-checkpoint-loaded" in node.log(), "the previous release up")
        assert node.daemon.proc is not None
        assert runs_from(node.daemon.proc.pid, old_src), "the previous release's code runs"
        assert "dra-cdi-orphan-removed" not in node.log(), node.log()
        assert {p.name for p in node.cdi_root.iterdir()} == specs, "no running claim's spec lost"
        assert alive(pid), "the MPS claim's daemon still serves"
        assert pid_of(pipe) == pid
        await node.kubelet.wait_registered(DRIVER, 30.0)
        assert [r.error for r in (await node.prepare(mps, plain)).values()] == ["", ""]
        assert await node.unprepare(mps, plain) == {mps.uid: "", plain.uid: ""}
        await node.wait(lambda: not alive(pid), "the claim's daemon stopped at Unprepare")
        assert list(node.cdi_root.iterdir()) == []
