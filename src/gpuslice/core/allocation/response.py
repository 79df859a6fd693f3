"""The Allocate response for one container, as plain data.

NVIDIA's plugin builds the response straight into protobuf; here it is frozen data so every
rule (device-list strategies, device specs, MPS, CDI) is tested without gRPC, and
`gpuslice.kubelet.convert` is the single place that turns it into a wire message.

Inputs that need the filesystem or randomness are injected by the adapter: `annotation_id`
(NVIDIA uses a fresh UUID in the CDI annotation key), `dev_nodes` (which optional control
nodes exist) and `mig_caps` (MIG capability device nodes, which NVIDIA resolves from
`/proc/driver/nvidia/capabilities/...`). The result is then a pure function of its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuslice.core.allocation.caps import AllocateCaps, allocation_caps_env
from gpuslice.core.allocation.softlimits import soft_limit_envs
from gpuslice.core.allocation.validation import validate_request
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    AllocateSettings,
    PhysicalDevice,
    ResourcePlan,
    SharingStrategy,
)

CDI_VENDOR_CLASS = "k8s.device-plugin.nvidia.com"
"""Vendor of the CDI spec NVIDIA's plugin generates; names are `<vendor>/<class>=<id>`."""

CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"
"""Middle part of the CDI annotation key, `<prefix>nvidia-device-plugin_<id>`."""

VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
"""Container directory the NVIDIA runtime reads device IDs from (volume-mounts strategy)."""

CONTROL_DEVICE_NODES: tuple[str, ...] = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
"""Optional control nodes, in NVIDIA's order; the adapter passes those that exist."""

DEFAULT_MPS_ROOT = "/run/nvidia/mps"
"""Host MPS root when `flags.mpsRoot` is empty (NVIDIA's Helm default)."""

MPS_CONTAINER_ROOT = "/mps"

IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
"""Where IMEX channel device nodes live (`internal/imex/imex.go`)."""


def imex_channel_path(channel: int) -> str:
    return f"{IMEX_CHANNEL_DIR}/channel{channel}"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: tuple[tuple[str, str], ...]
    """Sorted by name, so equal responses compare equal."""
    mounts: tuple[Mount, ...]
    devices: tuple[DeviceSpec, ...]
    annotations: tuple[tuple[str, str], ...]
    """Sorted by key."""
    cdi_devices: tuple[str, ...]
    """Fully qualified CDI names, e.g. `k8s.device-plugin.nvidia.com/gpu=GPU-...`."""

    def env(self, name: str) -> str | None:
        for key, value in self.envs:
            if key == name:
                return value
        return None


def host_path(root: str, path: str) -> str:
    """`<root>` + absolute `path`, as Go's filepath.Join does (root "/" or "" adds nothing)."""
    prefix = root.rstrip("/")
    return f"{prefix}{path}" if prefix else path


def physical_ids(
    devices: Sequence[AdvertisedDevice], settings: AllocateSettings
) -> tuple[tuple[str, PhysicalDevice], ...]:
    """(ID for the container runtime, physical device), deduplicated, first appearance first.

    Two replicas of one GPU are one device to the runtime: it is listed once, under its
    UUID or under its index (`0`, or `0:1` for a MIG device) per `deviceIDStrategy`.
    """
    out: dict[str, PhysicalDevice] = {}
    for dev in devices:
        phys = dev.physical
        key = phys.index_id if settings.device_id_strategy == "index" else phys.uuid
        out.setdefault(key, phys)
    return tuple(out.items())


def _cdi_names(ids: Sequence[str], settings: AllocateSettings) -> list[str]:
    names = [f"{CDI_VENDOR_CLASS}/gpu={i}" for i in ids]
    for enabled, name in (
        (settings.gdrcopy_enabled, "gdrcopy"),
        (settings.gds_enabled, "gds"),
        (settings.mofed_enabled, "mofed"),
    ):
        if enabled:
            names.append(f"{CDI_VENDOR_CLASS}/{name}=all")
    names.extend(f"{CDI_VENDOR_CLASS}/imex-channel={c}" for c in settings.imex_channels)
    return names


def _mps_edits(
    resource: ResourcePlan,
    devices: Sequence[AdvertisedDevice],
    settings: AllocateSettings,
    envs: dict[str, str],
    mounts: list[Mount],
) -> None:
    """Point the container at its resource's MPS daemon and show the share it gets.

    NVIDIA sets only the pipe directory; the limit variables are our addition. A client can
    only lower the daemon's defaults, so setting them equal to the defaults changes nothing
    for enforcement but makes the share visible to code inside the pod. No
    `CUDA_MPS_LOG_DIRECTORY`: only the control daemon and server write logs, and the log
    directory is not mounted into the container.
    """
    root = settings.mps_root or DEFAULT_MPS_ROOT
    pipe = f"{MPS_CONTAINER_ROOT}/{resource.name}/pipe"
    envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    mounts.append(
        Mount(
            container_path=pipe,
            host_path=host_path(root, f"/{resource.name}/pipe"),
            read_only=False,
        )
    )
    mounts.append(
        Mount(container_path="/dev/shm", host_path=host_path(root, "/shm"), read_only=False)
    )
    shares: dict[str, AdvertisedDevice] = {}
    for dev in devices:
        if dev.mps is not None:
            shares.setdefault(dev.physical.uuid, dev)
    if not shares:
        return
    limits = []
    for ordinal, dev in enumerate(shares.values()):
        assert dev.mps is not None
        if dev.mps.pinned_memory_limit_mib is not None:  # None: unified memory, no limit
            limits.append(f"{ordinal}={dev.mps.pinned_memory_limit_mib}M")
    percentage = min(d.mps.active_thread_percentage for d in shares.values() if d.mps is not None)
    envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percentage)
    if limits:
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)


def _device_specs(
    physical: Sequence[PhysicalDevice],
    settings: AllocateSettings,
    dev_nodes: frozenset[str],
    mig_caps: Mapping[str, tuple[str, ...]],
) -> tuple[DeviceSpec, ...]:
    paths: list[str] = [p for p in CONTROL_DEVICE_NODES if p in dev_nodes]
    for phys in physical:
        paths.append(f"/dev/nvidia{phys.minor}")
        if phys.kind == "mig":
            paths.extend(mig_caps.get(phys.uuid, ()))
    paths.extend(imex_channel_path(c) for c in settings.imex_channels)
    unique = dict.fromkeys(paths)
    return tuple(
        DeviceSpec(
            container_path=p, host_path=host_path(settings.nvidia_dev_root, p), permissions="rw"
        )
        for p in unique
    )


def build_allocation(
    resource: ResourcePlan,
    settings: AllocateSettings,
    device_ids: Sequence[str],
    *,
    annotation_id: str,
    dev_nodes: frozenset[str] = frozenset(),
    mig_caps: Mapping[str, tuple[str, ...]] | None = None,
    lookup: Mapping[str, AdvertisedDevice] | None = None,
    caps: AllocateCaps | None = None,
) -> ContainerAllocation:
    """The response for one container request; AllocationError if the request is invalid.

    `dev_nodes`: which of `CONTROL_DEVICE_NODES` exist on the host (only those get device
    specs, as in NVIDIA's plugin). `mig_caps`: MIG UUID -> capability device paths
    (`/dev/nvidia-caps/nvidia-cap<N>` for its GI and CI); empty means none are passed, which
    is enough when the NVIDIA container runtime injects them itself. Both only matter with
    `passDeviceSpecs`. `lookup`: `device_lookup(resource)` built once per plan by the caller;
    without it every call rebuilds it (O(devices): 0.5 ms at 8,192 replicas). `caps`: the
    node's memory caps as the agent found them; a capped time-sliced share reaching the
    container through CDI then carries the toolkit hook's limits (`core.allocation.caps`).

    Order follows NVIDIA: CDI edits, MPS, gdrcopy/gds/mofed; if every selected strategy is a
    CDI one the response ends there, otherwise envvar, volume-mounts and device specs follow.
    """
    devices = validate_request(resource, device_ids, lookup)
    physical = physical_ids(devices, settings)
    ids = [key for key, _ in physical]
    strategies = settings.device_list_strategies
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []

    if any(s.startswith("cdi-") for s in strategies):
        names = _cdi_names(ids, settings)
        if "cdi-annotations" in strategies:
            key = f"{settings.cdi_annotation_prefix}{CDI_ANNOTATION_PLUGIN}_{annotation_id}"
            annotations[key] = ",".join(names)
        if "cdi-cri" in strategies:
            cdi_devices.extend(names)
    if resource.strategy == SharingStrategy.MPS:
        _mps_edits(resource, devices, settings, envs, mounts)
    if resource.strategy == SharingStrategy.TIME_SLICING:
        if settings.memory_soft_limits:
            envs.update(soft_limit_envs(devices))
        envs.update(allocation_caps_env(devices, strategies, caps))
    for enabled, name in (
        (settings.gdrcopy_enabled, "NVIDIA_GDRCOPY"),
        (settings.gds_enabled, "NVIDIA_GDS"),
        (settings.mofed_enabled, "NVIDIA_MOFED"),
    ):
        if enabled:
            envs[name] = "enabled"

    specs: tuple[DeviceSpec, ...] = ()
    if not all(s.startswith("cdi-") for s in strategies):
        channels = [str(c) for c in settings.imex_channels]
        if "envvar" in strategies:
            envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            if channels:
                # NVIDIA `internal/plugin/server.go`: the runtime hook reads the channels here.
                envs["NVIDIA_IMEX_CHANNELS"] = ",".join(channels)
        if "volume-mounts" in strategies:
            envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNTS_ROOT
            mounts.extend(
                Mount(
                    container_path=f"{VOLUME_MOUNTS_ROOT}/{i}",
                    host_path="/dev/null",
                    read_only=False,
                )
                for i in ids
            )
            mounts.extend(
                Mount(
                    container_path=f"{VOLUME_MOUNTS_ROOT}/imex/{c}",
                    host_path="/dev/null",
                    read_only=False,
                )
                for c in channels
            )
        if settings.pass_device_specs:
            specs = _device_specs([p for _, p in physical], settings, dev_nodes, mig_caps or {})

    return ContainerAllocation(
        envs=tuple(sorted(envs.items())),
        mounts=tuple(mounts),
        devices=specs,
        annotations=tuple(sorted(annotations.items())),
        cdi_devices=tuple(cdi_devices),
    )
