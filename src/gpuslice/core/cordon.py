"""A per-GPU cordon an operator sets on the Node, without draining it.

`kubectl annotate node <node> gpuslice.io/gpu-cordon=<entry>,<entry>` takes GPUs out of
service for new work while their running pods stay: each entry is a GPU UUID, a MIG
device UUID, or a GPU index (`nvidia-smi`'s). Device plugin mode publishes the cordoned
GPUs' devices (every replica) Unhealthy, so the kubelet admits no new pod to them; DRA mode
taints them `NoSchedule` in the ResourceSlice, so the scheduler allocates them to no new
claim. Removing the annotation (or an entry) lifts it. HAMi's `hami.io/device-cordon` is
the model; the annotation is read through the agent's one Node watch.

An entry that names nothing on this node is reported and skipped: a typo must not cordon
other GPUs, nor make the agent refuse the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice.core.devices import Inventory

CORDON_ANNOTATION = "gpuslice.io/gpu-cordon"
CORDON_TAINT = "gpuslice.io/gpu-cordon"
"""The DRA device taint of a cordoned device (effect `NoSchedule`, no value)."""
MAX_ENTRIES = 1024
"""More entries than any node has GPUs and MIG devices: the rest is not read."""
_SPLIT = re.compile(r"[\s,]+")


@dataclass(frozen=True, slots=True)
class Cordon:
    """What the annotation cordons on this node."""

    devices: frozenset[str] = frozenset()
    """Physical UUIDs: each cordoned GPU with all its MIG devices, and cordoned MIG devices."""
    names: tuple[str, ...] = ()
    """The cordoned GPUs and MIG devices as `<index> (<uuid>)`, in inventory order (for
    logs and Events)."""
    problems: tuple[str, ...] = ()
    """Entries skipped, each naming the annotation and the entry."""


def parse_cordon(value: str, inventory: Inventory) -> Cordon:
    """The cordon `value` (the annotation's text; "" when absent) asks for on `inventory`."""
    entries = [e for e in _SPLIT.split(value.strip()) if e][:MAX_ENTRIES]
    wanted: set[str] = set()
    problems: list[str] = []
    by_uuid: dict[str, str] = {g.uuid.lower(): g.uuid for g in inventory.gpus}
    by_uuid.update({m.uuid.lower(): m.uuid for m in inventory.mig_devices()})
    by_index = {str(g.index): g.uuid for g in inventory.gpus}
    for entry in entries:
        uuid = by_uuid.get(entry.lower()) or by_index.get(entry)
        if uuid is None:
            shown = entry if len(entry) <= 80 else entry[:77] + "..."
            problems.append(
                f"{CORDON_ANNOTATION}: {shown!r} is no GPU UUID, MIG device UUID or GPU index "
                f"on this node (GPU indices 0..{len(inventory.gpus) - 1}); skipped"
            )
            continue
        wanted.add(uuid)
    devices: set[str] = set()
    names: list[str] = []
    for gpu in inventory.gpus:
        if gpu.uuid in wanted:
            devices.add(gpu.uuid)
            devices.update(m.uuid for m in gpu.mig_devices)
            names.append(f"{gpu.index} ({gpu.uuid})")
            continue
        for mig in gpu.mig_devices:
            if mig.uuid in wanted:
                devices.add(mig.uuid)
                names.append(f"{mig.index_id} ({mig.uuid})")
    return Cordon(frozenset(devices), tuple(names), tuple(problems))
