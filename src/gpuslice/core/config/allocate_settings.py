"""The part of a config that shapes Allocate responses, resolved to final values.

Resolution (dev root falls back to the driver root, an empty MPS root means the Helm
chart's `/run/nvidia/mps`) happens once here so the allocation code never has to know
which config fields may be empty.
"""

from __future__ import annotations

from gpuslice.core.config.schema import Config
from gpuslice.core.sharing.model import AllocateSettings, HostFacts


def allocate_settings(config: Config, host: HostFacts | None = None) -> AllocateSettings:
    """Without `host`: the config alone, as NVIDIA's plugin would read it before looking at
    the node (every configured IMEX channel, no soft limits)."""
    flags = config.flags
    plugin = flags.plugin
    return AllocateSettings(
        device_list_strategies=tuple(dict.fromkeys(plugin.device_list_strategy)),
        device_id_strategy=plugin.device_id_strategy,
        pass_device_specs=plugin.pass_device_specs,
        cdi_annotation_prefix=plugin.cdi_annotation_prefix,
        nvidia_dev_root=flags.effective_dev_root,
        mps_root=flags.effective_mps_root,
        allocation_policy=plugin.shared_devices_allocation_policy,
        gdrcopy_enabled=flags.gdrcopy_enabled,
        gds_enabled=flags.gds_enabled,
        mofed_enabled=flags.mofed_enabled,
        imex_channels=config.imex.channel_ids if host is None else host.imex_channels,
        memory_soft_limits=False if host is None else host.memory_soft_limits,
    )
