"""Where the NVIDIA device nodes are, as NVIDIA's plugins decide it.

On a node whose driver is installed by a driver container, the device nodes may live under
the driver's root (`/run/nvidia/driver/dev/nvidiactl`) rather than in the host's `/dev`. The
agent sees the host's driver root at `containerDriverRoot` (the chart mounts it at
`/driver-root`). NVIDIA's device plugin and DRA driver (`root.getDevRoot`, in
`cmd/nvidia-device-plugin/root.go` and `cmd/gpu-kubelet-plugin/root.go`) take that root as the
dev root when it holds a `dev` directory, and `/` otherwise. A CDI spec that named
`/dev/nvidiactl` on such a node would make the runtime refuse the container ("failed to
stat CDI host device"), so the host path written there follows this decision.
"""

from __future__ import annotations

from pathlib import Path


def holds_dev(root: str) -> bool:
    """NVIDIA's `isDevRoot`: `<root>/dev` is a directory (following symlinks)."""
    try:
        return (Path(root) / "dev").is_dir()
    except OSError:
        return False


def container_dev_root(container_driver_root: str) -> str:
    """The dev root as the agent sees it: the container driver root when it holds `dev`,
    else `/` (NVIDIA's `getDevRoot`)."""
    return container_driver_root if holds_dev(container_driver_root) else "/"


def host_dev_root(container_driver_root: str, host_dev_root_setting: str) -> str:
    """The dev root on the host, for the `hostPath` of a device node in a CDI spec:
    `host_dev_root_setting` (nvidiaDevRoot, else nvidiaDriverRoot) when the driver root
    seen in the container holds `dev`, else `/`. NVIDIA gets the same by transforming its
    spec from the container's root to the host's (`transformroot`)."""
    return host_dev_root_setting if holds_dev(container_driver_root) else "/"
