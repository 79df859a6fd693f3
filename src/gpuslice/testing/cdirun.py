"""What a container runtime makes of CDI device IDs, for tests: the CDI library's injection
order, without a runtime.

For each ID in the order the kubelet lists them, the runtime finds the device in the spec
of its kind; the spec's own `containerEdits` are applied the first time one of its devices
is, then the device's. An environment variable set again keeps the last value; a device
node or a mount at a path already given replaces it (`ContainerEdits.Apply`); hooks add
up. This is what decides whether a container with several devices sees all its GPUs, so the
CDI tests check it this way rather than device by device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuslice.core.jsontypes import Json


@dataclass
class Container:
    env: dict[str, str] = field(default_factory=dict)
    device_nodes: dict[str, Json] = field(default_factory=dict)
    """By container path, in the order first given."""
    mounts: list[Json] = field(default_factory=list)
    hooks: list[Json] = field(default_factory=list)

    def apply(self, edits: Json) -> None:
        for entry in edits.get("env") or ():
            name, _, value = str(entry).partition("=")
            self.env[name] = value
        for node in edits.get("deviceNodes") or ():
            self.device_nodes[str(node["path"])] = dict(node)
        for mount in edits.get("mounts") or ():
            path = mount["containerPath"]
            self.mounts = [m for m in self.mounts if m["containerPath"] != path]
            self.mounts.append(dict(mount))
        self.hooks.extend(dict(h) for h in edits.get("hooks") or ())

    def mounted_under(self, directory: str) -> list[str]:
        prefix = directory.rstrip("/") + "/"
        return [m["containerPath"].removeprefix(prefix) for m in self.mounts
                if m["containerPath"].startswith(prefix)]  # fmt: skip


def inject(specs: Sequence[Json], ids: Sequence[str]) -> Container:
    """The container after the runtime applied `ids` (`<kind>=<name>`) from `specs`;
    KeyError for an ID no spec resolves (the runtime's "unresolvable CDI devices")."""
    devices: dict[str, tuple[int, Json]] = {}
    for n, spec in enumerate(specs):
        for device in spec["devices"]:
            devices[f"{spec['kind']}={device['name']}"] = (n, device)
    container = Container()
    applied: set[int] = set()
    for cdi_id in ids:
        n, device = devices[cdi_id]
        if n not in applied:
            applied.add(n)
            container.apply(specs[n].get("containerEdits") or {})
        container.apply(device.get("containerEdits") or {})
    return container
