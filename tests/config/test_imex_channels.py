"""IMEX channels checked on the host as NVIDIA's `internal/imex/imex.go` (GetChannels) does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.agent.imex import ImexChannelMissing, present_channels, with_imex
from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.sharing.plan import build_plan


def _config(dev_root: Path, required: bool) -> str:
    return (
        f"flags:\n  nvidiaDevRoot: {dev_root}\n"
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
    backend = open_backend("sim:1xh100-80gb", environ={})
    try:
        inv = backend.inventory()
    finally:
        backend.close()
    plan = with_imex(build_plan(inv, config), config)
    assert plan.allocate.imex_channels == (0,)
