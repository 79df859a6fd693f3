"""`gpuslice describe` and the daemon build the node's plan with one function, so the plan
describe prints is the one the daemon serves, host facts (IMEX channels found, soft limits)
included: before issue 31 describe left out both."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuslice.agent.runner import first_plan
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.cli.common import plan_for

NODE = "sim:1xl40s"


def _config(tmp_path: Path) -> Path:
    """Time-sliced 4 ways (soft limits apply) with IMEX channel 0 configured; it exists
    under the container driver root only, where the agent looks."""
    channel = tmp_path / "root/dev/nvidia-caps-imex-channels/channel0"
    channel.parent.mkdir(parents=True)
    channel.symlink_to("/dev/null")  # stands in for the character device
    path = tmp_path / "config.yaml"
    path.write_text(
        f"flags:\n  plugin:\n    containerDriverRoot: {tmp_path / 'root'}\n"
        "imex:\n  channelIDs: [0]\n  required: false\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    return path


def test_describe_prints_the_plan_the_daemon_serves(tmp_path: Path) -> None:
    path = _config(tmp_path)
    described = plan_for(NODE, path).plan

    backend = open_backend(NODE, environ={})
    try:
        settings = AgentSettings(node=NODE, config_path=path)
        served = asyncio.run(first_plan(settings, backend)).loaded.plan
    finally:
        backend.close()

    assert described == served
    assert served.allocate.imex_channels == (0,)
    assert served.allocate.memory_soft_limits is True
