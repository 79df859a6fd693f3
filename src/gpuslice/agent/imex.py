"""IMEX channels: which configured channels exist on the host, checked as NVIDIA does.

NVIDIA's plugin (`internal/imex/imex.go`, `GetChannels`) looks for each configured channel's
device node under the device root; a missing channel is skipped with a warning, unless
`imex.required` is set, when the plugin refuses to start. The core's Allocate response then
adds only the channels found here.
"""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

from gpuslice.core.allocation.response import imex_channel_path
from gpuslice.core.config import Config
from gpuslice.core.errors import GpusliceError
from gpuslice.core.sharing.model import Plan
from gpuslice.logs import get_logger

log = get_logger("gpuslice.agent")


class ImexChannelMissing(GpusliceError):
    """`imex.required` is set and a configured channel's device node is not there."""


def _exists(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def present_channels(config: Config) -> tuple[int, ...]:
    """The configured channels whose character device exists under `nvidiaDevRoot`."""
    root = Path(config.flags.effective_dev_root)
    found: list[int] = []
    for channel in config.imex.channel_ids:
        path = root / imex_channel_path(channel).lstrip("/")
        if _exists(path):
            found.append(channel)
        elif config.imex.required:
            raise ImexChannelMissing(
                f"imex.required is true but IMEX channel {channel} does not exist: no "
                f"character device at {path}; create the channel (the IMEX daemon or "
                "`nvidia-modprobe -i`), or set imex.required: false to start without it"
            )
        else:
            log.warning(
                "imex-channel-missing", channel=channel, path=str(path), message="ignoring it"
            )
    return tuple(found)


def with_imex(plan: Plan, config: Config) -> Plan:
    """`plan` granting only the IMEX channels present now; raises if a required one is not."""
    channels = present_channels(config)
    if channels == plan.allocate.imex_channels:
        return plan
    return dataclasses.replace(
        plan, allocate=dataclasses.replace(plan.allocate, imex_channels=channels)
    )
