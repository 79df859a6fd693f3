"""IMEX channels: which configured channels exist, looked up as NVIDIA does.

NVIDIA's plugin (`internal/imex/imex.go`, `GetChannels`, called with
`root(containerDriverRoot).getDevRoot()` from `cmd/nvidia-device-plugin/plugin-manager.go`)
looks for each configured channel's character device under the dev root the plugin's
container sees (the container driver root when it holds `dev/`, else `/`), and also at the
plain `/dev/...` path, where a channel injected into the agent's own container appears. A
missing channel is skipped with a warning, unless `imex.required` is set, when the plugin
refuses to start. `agent.plan` hands the channels found here to the core's plan, and
Allocate grants only those
(its device spec's host path is under nvidiaDevRoot, as NVIDIA's `server.go` writes it).
"""

from __future__ import annotations

import stat
from pathlib import Path

from gpuslice.core.allocation.response import imex_channel_path
from gpuslice.core.config import Config
from gpuslice.core.errors import GpusliceError
from gpuslice.host.devroot import container_dev_root
from gpuslice.logs import get_logger

log = get_logger("gpuslice.agent")


class ImexChannelMissing(GpusliceError):
    """`imex.required` is set and a configured channel's device node is not there."""


def _exists(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _candidates(dev_root: str, channel: int) -> list[Path]:
    container_path = imex_channel_path(channel)
    under_root = Path(dev_root) / container_path.lstrip("/")
    return [under_root] if str(under_root) == container_path else [under_root, Path(container_path)]


def present_channels(config: Config) -> tuple[int, ...]:
    """The configured channels whose character device exists under the dev root seen from
    here (`flags.plugin.containerDriverRoot`'s, as NVIDIA's getDevRoot picks it) or at its
    plain `/dev` path."""
    dev_root = container_dev_root(config.flags.plugin.container_driver_root)
    found: list[int] = []
    for channel in config.imex.channel_ids:
        paths = _candidates(dev_root, channel)
        if any(_exists(p) for p in paths):
            found.append(channel)
            continue
        where = " or ".join(str(p) for p in paths)
        if config.imex.required:
            raise ImexChannelMissing(
                f"imex.required is true but IMEX channel {channel} does not exist: no "
                f"character device at {where}; create the channel (the IMEX daemon or "
                "`nvidia-modprobe -i`), or set imex.required: false to start without it"
            )
        log.warning("imex-channel-missing", channel=channel, path=where, message="ignoring it")
    return tuple(found)
