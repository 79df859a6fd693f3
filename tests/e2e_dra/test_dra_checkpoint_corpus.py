"""Through `gpuslice plugin --dra` as a process: whatever is at the checkpoint's path at start
(`gpuslice.testing.hostile_checkpoints`), the agent registers, publishes and prepares a
claim, and the bad entry is kept aside, not deleted, with a Warning Event that names it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpuslice.host.checkpoint_file import CHECKPOINT_NAME
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.hostile_checkpoints import HOSTILE
from tests.e2e_dra.dra_node import claim_obj, request, running_dra_node


def _what(path: Path) -> tuple[str, int]:
    mode = path.lstat().st_mode
    kind = (
        "symlink" if stat.S_ISLNK(mode)
        else "dir" if stat.S_ISDIR(mode)
        else "fifo" if stat.S_ISFIFO(mode)
        else "file"
    )  # fmt: skip
    return kind, path.lstat().st_size if kind == "file" else 0


@pytest.mark.parametrize("entry", sorted(HOSTILE))
async def test_a_bad_checkpoint_is_kept_aside_and_the_agent_serves(
    entry: str, sock_dir: Path, api: FakeApiServer
) -> None:
    plugin_dir = sock_dir / "plug"
    plugin_dir.mkdir()
    path = plugin_dir / CHECKPOINT_NAME
    HOSTILE[entry](path)
    before = _what(path)
    async with running_dra_node(sock_dir, api) as node:
        ref = node.allocate(claim_obj("c1", [request("gpu")]), devices={"gpu": "gpu-0"})
        assert (await node.prepare(ref))[ref.uid].error == ""
        [kept] = [
            p for p in plugin_dir.iterdir() if p.name.startswith(f"{CHECKPOINT_NAME}.corrupt-")
        ]
        assert _what(kept) == before, "kept as it was"
        assert _what(path)[0] == "file", "a new record was written in its place"
        events = [e for e in api.events() if e.get("reason") == "CheckpointCorrupt"]
        assert events, node.daemon.log()
        assert f"kept as {kept}" in events[0]["message"]
        assert await node.unprepare(ref) == {ref.uid: ""}
        assert node.daemon.running
