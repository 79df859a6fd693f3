"""The health of every device this node publishes, as the kubelet's DRA health stream
reports it (KEP-4680, `DRAResourceHealth/NodeWatchResources`).

The kubelet shows it in the pod status of the containers that use the device
(`allocatedResourcesStatus`), so each entry names the device exactly as the ResourceSlice
does (pool = node name, device = `dra_devices`' name) and every published device is in the
list: the kubelet expects the complete list in each response, and a device left out would
drift to Unknown after its timeout. The same facts make the health taints
(`publish.taints`): a device is unhealthy when its own UUID (a MIG device) or its physical
GPU's is in the agent's unhealthy set.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.core.devices import Inventory
from gpuslice.core.dra.publish import DraDevice, dra_devices
from gpuslice.core.health import Unmonitored

MAX_HEALTH_MESSAGE_CHARS = 1024
"""The kubelet keeps at most this many characters of a device's health message."""


@dataclass(frozen=True, slots=True)
class DeviceHealthReport:
    """One device's health as the kubelet is told it."""

    pool: str
    device: str
    healthy: bool
    message: str = ""
    """Why the device is unhealthy ("" when healthy): `XID 79 on GPU-…`, `GPU-… lost`."""
    monitored: bool = True
    """False: its GPU's health events could not be registered, so a healthy device is
    reported Unknown (nothing would tell if it were not), the message saying why."""


def device_health(
    inventory: Inventory,
    unhealthy: Collection[str],
    xids: Mapping[str, int | None],
    *,
    pool: str,
    devices: Sequence[DraDevice] | None = None,
    unmonitored: Mapping[str, Unmonitored] | None = None,
) -> tuple[DeviceHealthReport, ...]:
    """Every device `dra_devices(inventory)` publishes (or `devices`, where dynamic MIG
    partitions replace a GPU's, `core.dra.partitions.node_devices`), in that order, with
    its health. A partition whose MIG device gpuslice created answers for that device.

    `unhealthy` holds physical UUIDs (GPU or MIG device); `xids` is the last health event
    per UUID: an XID code, or None for a GPU that fell off the bus. A device unhealthy for
    a reason without an event there (e.g. its MPS daemon is down) says so plainly.
    `unmonitored` (GPU UUID -> why) are the GPUs whose health is not watched: their devices
    are Unknown unless known to be unhealthy.
    """
    listed = dra_devices(inventory) if devices is None else devices
    unwatched = unmonitored or {}
    return tuple(_report(d, unhealthy, xids, pool, unwatched) for d in listed)


def _report(
    device: DraDevice,
    unhealthy: Collection[str],
    xids: Mapping[str, int | None],
    pool: str,
    unmonitored: Mapping[str, Unmonitored],
) -> DeviceHealthReport:
    if device.uuid and device.uuid in unhealthy:
        uuid = device.uuid
    elif device.gpu.uuid in unhealthy:
        uuid = device.gpu.uuid
    else:
        why = unmonitored.get(device.gpu.uuid)
        if why is not None:
            message = f"health events of {device.gpu.uuid} are not watched: {why.reason}"
            return DeviceHealthReport(pool, device.name, True, health_message(message), False)
        return DeviceHealthReport(pool, device.name, True)
    # an XID is recorded against the physical GPU, also for a MIG device on it
    key = uuid if uuid in xids else device.gpu.uuid
    if key in xids:
        xid = xids[key]
        message = f"XID {xid} on {key}" if xid is not None else f"GPU {key} lost"
    else:
        message = f"{uuid} marked unhealthy by gpuslice"
    return DeviceHealthReport(pool, device.name, False, health_message(message))


def health_message(text: str) -> str:
    """`text` within the kubelet's limit, cut the way the kubelet cuts it (1021 + `...`)."""
    if len(text) <= MAX_HEALTH_MESSAGE_CHARS:
        return text
    return text[: MAX_HEALTH_MESSAGE_CHARS - 3] + "..."
