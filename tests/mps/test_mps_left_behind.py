"""What an earlier agent's MPS daemons left under the MPS root, read by the next agent's
manager before it advertises (`MpsDaemonManager.quit_left_behind`): only the agent's own
resource directories count, and only GPU UUIDs reach `nvidia-smi`. The daemons themselves
are the e2e tests' (tests/e2e/test_mps_restart_into_another_config.py)."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import gpu
from .test_mps_manager import fake_smi, manager_for, spec_for


def left(root: Path, resource: str, gpus: list[str]) -> Path:
    """A resource directory as a stopped agent leaves it: pipe directory, started marker."""
    base = root / resource
    (base / "pipe").mkdir(parents=True)
    (base / ".started").write_text(json.dumps({"gpu_uuids": gpus}))
    return base


async def test_only_the_agents_own_directories_are_undone(sock_dir: Path) -> None:
    calls = sock_dir / "smi.log"
    root = sock_dir / "mps"
    wanted = spec_for(root, name="nvidia.com/gpu.shared", index=0)
    manager = manager_for([wanted], compute_mode=fake_smi(calls, "ok"))
    old = left(root, "nvidia.com/gpu", [gpu(0).uuid, gpu(1).uuid])
    # planted by a client pod in the shared shm directory it mounts: not the agent's
    left(root, "shm/planted", [gpu(2).uuid])
    left(root, "example.com/odd", ["-c", "GPU-x;rm", gpu(3).uuid])
    await manager.quit_left_behind(str(root))
    sent = calls.read_text().splitlines()
    # GPU 0 is the renamed resource's: its daemon wants it exclusive
    assert sent == [f"-i {gpu(3).uuid} -c DEFAULT", f"-i {gpu(1).uuid} -c DEFAULT"]
    assert not (old / ".started").exists(), "undone once"
    assert (root / "shm" / "planted" / ".started").exists()
    await manager.quit_left_behind(str(root))
    assert calls.read_text().splitlines() == sent
