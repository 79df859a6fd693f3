"""The MPS daemon as the e2e tests drive it: a config with MPS replicas and a question to the
control daemon over its pipe directory."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

WAIT_S = 15.0


def mps_config(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  mps:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


async def ask_daemon(pipe_dir: Path, command: str) -> str:
    """What a pod's `echo cmd | nvidia-cuda-mps-control` would print."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuslice.emulator.fake_mps_control",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)},
    )
    out, err = await proc.communicate(f"{command}\n".encode())
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()
