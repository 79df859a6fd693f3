"""The device plugin daemon on a unified-memory GPU (`sim:1xgb10`, a GB10 / DGX Spark whose
memory NVML does not report): it starts, says once why its memory features are off, and
shares the GPU by count; MPS replicas get their SM share and no pinned memory limit."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.mps_support import ask_daemon, mps_config

WAIT_S = 15.0


async def test_mps_replicas_on_a_gb10_have_an_sm_share_and_no_memory_limit(
    sock_dir: Path,
) -> None:
    mps_root = sock_dir / "mps"
    args = ["--mps-root", str(mps_root), "--no-labels"]
    async with running_daemon(sock_dir, mps_config(4), node="sim:1xgb10", args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 4, WAIT_S)
        pipe = mps_root / "nvidia.com/gpu/pipe"
        assert float(await ask_daemon(pipe, "get_default_active_thread_percentage")) == 25

        adm = await kubelet.admit("ml", "infer-0", [("main", {"nvidia.com/gpu": 1})])
        envs = adm.containers[0].envs
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs
        log = node.daemon.log()
        assert log.count("event=gpu-memory-not-reported") == 1, log
        assert "no MPS pinned memory limit" in log
    await ask_daemon(pipe, "quit")  # the test's cleanup: no agent follows
