"""IMEX channels looked up as NVIDIA's `internal/imex/imex.go` (GetChannels) does: under the
dev root of the container driver root (`getDevRoot`), then at the plain /dev path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.agent.imex import ImexChannelMissing, present_channels
from gpuslice.agent.plan import plan_node
from gpuslice.agent.settings import AgentSettings
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config


def _config(driver_root: Path, required: bool) -> str:
    return (
        f"flags:\n  plugin:\n    containerDriverRoot: {driver_root}\n"
        f"imex:\n  channelIDs: [0]\n  required: {'true' if required else 'false'}\n"
    )


def _channel(dev_root: Path) -> Path:
    path = dev_root / "dev/nvidia-caps-imex-channels/channel0"
    path.parent.mkdir(parents=True)
    return path


def test_required_missing_channel_refuses_like_nvidia_imex_go(tmp_path: Path) -> None:
    """NVIDIA GetChannels: with `required: true` a missing channel is an error, so the
    plugin does not start."""
    with pytest.raises(ImexChannelMissing, match=r"IMEX channel 0 does not exist"):
        present_channels(parse_config(_config(tmp_path, required=True)))


def test_optional_missing_channel_is_skipped(tmp_path: Path) -> None:
    assert present_channels(parse_config(_config(tmp_path, required=False))) == ()


def test_a_regular_file_is_not_a_channel(tmp_path: Path) -> None:
    _channel(tmp_path).write_text("")
    assert present_channels(parse_config(_config(tmp_path, required=False))) == ()


def test_present_channel_is_granted_in_the_plan(tmp_path: Path) -> None:
    # /dev/null stands in for the channel's character device (mknod would need root).
    _channel(tmp_path).symlink_to("/dev/null")
    config = parse_config(_config(tmp_path, required=True))
    backend = open_backend("sim:1xh100-80gb")
    try:
        inv = backend.inventory()
    finally:
        backend.close()
    plan = plan_node(inv, config, AgentSettings())
    assert plan.allocate.imex_channels == (0,)


def test_the_channel_is_looked_up_under_the_container_driver_root_not_the_host_dev_root(
    tmp_path: Path,
) -> None:
    """nvidiaDevRoot is the host's path (it goes into the device spec); what the agent can
    see is the container driver root, so a channel only under nvidiaDevRoot is not found."""
    host = tmp_path / "host"
    _channel(host).symlink_to("/dev/null")
    text = (
        f"flags:\n  nvidiaDevRoot: {host}\n  plugin:\n    containerDriverRoot: {tmp_path}/none\n"
        "imex:\n  channelIDs: [0]\n  required: false\n"
    )
    assert present_channels(parse_config(text)) == ()


def test_a_driver_root_without_dev_means_the_dev_root_is_slash(tmp_path: Path) -> None:
    """getDevRoot: a root with no `dev` directory is not a dev root, so NVIDIA looks at
    /dev itself; the error names both places it looked."""
    (tmp_path / "usr").mkdir()
    with pytest.raises(ImexChannelMissing) as refused:
        present_channels(parse_config(_config(tmp_path, required=True)))
    assert str(tmp_path) not in str(refused.value)
    assert "/dev/nvidia-caps-imex-channels/channel0" in str(refused.value)
