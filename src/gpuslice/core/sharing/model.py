"""The sharing plan's data: what each advertised resource is made of.

A plan is computed once per (inventory, config) pair by `gpuslice.core.sharing.plan` and
then only read: the kubelet servers stream it, Allocate answers from it, the labels and the
MPS daemon manager are derived from it. Keeping it frozen data makes "what does this node
advertise?" a value that can be printed, diffed and tested without any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NewType

from gpuslice.core.devices import Gpu, GpuUuid, MigDevice

ResourceName = NewType("ResourceName", str)
"""Fully qualified extended resource name, e.g. `nvidia.com/gpu.shared`."""

DeviceId = NewType("DeviceId", str)
"""The ID advertised to the kubelet: a UUID, or a replica ID `<uuid>::<n>`."""


class SharingStrategy(StrEnum):
    """How a device is shared: the one vocabulary of both front ends and of everything that
    asks how a holder shares its device (attribution, the guard, caps, describe, what-if).

    A `StrEnum` so the values are the strings the device plugin has always printed, logged
    and checkpointed (`mps`, `time-slicing`, `none`): a value read back from JSON compares
    equal to its member. The other wire spellings are conversions of a member, never
    compared anywhere else: NVIDIA's DRA opaque configs name two of them (`nvidia_name`,
    read with `from_nvidia`), GFD's `sharing-strategy` label (`label_value`), a holder's kind
    in the reports (`entitlement_kind`: `exclusive`) and describe's `isolation`."""

    NONE = "none"
    """Not shared: one holder has the whole device."""
    TIME_SLICING = "time-slicing"
    MPS = "mps"
    MIG = "mig"
    """A MIG device held whole: memory and SMs of its own. Only a holder's entitlement is
    MIG; a plan's MIG resource says how its MIG devices are shared (NONE when they are not)."""

    @classmethod
    def from_nvidia(cls, name: NvidiaSharingName | None) -> SharingStrategy:
        """NVIDIA's `sharing.strategy` (None: no sharing asked) as this type."""
        if name is None:
            return cls.NONE
        return cls.MPS if name == "MPS" else cls.TIME_SLICING

    @property
    def nvidia_name(self) -> NvidiaSharingName:
        """How NVIDIA's DRA configs (and Prepare's records of what it set) name it; only
        time-slicing and MPS have a name there."""
        if self is SharingStrategy.MPS:
            return "MPS"
        if self is SharingStrategy.TIME_SLICING:
            return "TimeSlicing"
        raise ValueError(f"NVIDIA's sharing.strategy has no name for {self.value!r}")

    @property
    def shares_memory(self) -> bool:
        """Its holders share one memory, which nothing but an MPS server's limit divides:
        what the guard watches and may reclaim. An exclusive holder or a MIG device has
        memory of its own."""
        return self in (SharingStrategy.TIME_SLICING, SharingStrategy.MPS)

    @property
    def label_value(self) -> str:
        """GFD's `<resource>.sharing-strategy` label: a MIG device held whole is unshared."""
        return SharingStrategy.NONE.value if self is SharingStrategy.MIG else self.value

    @property
    def entitlement_kind(self) -> str:
        """A holder's kind as `status`, `top` and `describe --claims` print it: `exclusive`
        for a device nobody shares."""
        return "exclusive" if self is SharingStrategy.NONE else self.value

    @property
    def isolation(self) -> Isolation:
        """What isolates its holders, as `describe -o json` says: an MPS server's limits, a
        MIG device's hardware, else nothing (`none`: time-slicing, or a whole GPU)."""
        if self is SharingStrategy.MPS:
            return "mps"
        return "mig" if self is SharingStrategy.MIG else "none"


NvidiaSharingName = Literal["TimeSlicing", "MPS"]
"""`sharing.strategy` as NVIDIA's `GpuConfig` / `MigDeviceConfig` spell it on the wire."""
Isolation = Literal["none", "mps", "mig"]
"""`SharingStrategy.isolation`: describe's JSON field."""
MigStrategy = Literal["none", "single", "mixed"]
DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
DeviceIdStrategy = Literal["uuid", "index"]
AllocationPolicy = Literal["distributed", "packed"]

REPLICA_SEPARATOR = "::"


def replica_id(base: str, n: int) -> DeviceId:
    return DeviceId(f"{base}{REPLICA_SEPARATOR}{n}")


def split_replica_id(device_id: str) -> tuple[str, int | None]:
    """`GPU-a::3` -> (`GPU-a`, 3); a plain UUID -> (uuid, None). Splits at the first `::`."""
    base, sep, rest = device_id.partition(REPLICA_SEPARATOR)
    if not sep:
        return device_id, None
    try:
        return base, int(rest)
    except ValueError:
        return base, None


@dataclass(frozen=True, slots=True)
class PhysicalDevice:
    """What stands behind an advertised device: a whole GPU or one MIG device."""

    uuid: str
    """`GPU-...` for a whole GPU, `MIG-...` for a MIG device."""
    index_id: str
    """`"0"` for a whole GPU, `"0:1"` for a MIG device (NVIDIA's index strategy)."""
    gpu_uuid: GpuUuid
    """The physical GPU (the parent, for a MIG device)."""
    gpu_index: int
    kind: Literal["gpu", "mig"]
    product_name: str
    memory_mib: int
    multiprocessors: int
    minor: int
    numa_node: int | None = None
    profile: str | None = None
    """MIG profile (`1g.10gb`), None for a whole GPU."""
    gi_id: int | None = None
    ci_id: int | None = None

    @property
    def memory_reported(self) -> bool:
        """False on a unified-memory GPU (`Gpu.memory_reported`): `memory_mib` is 0."""
        return self.memory_mib > 0

    @classmethod
    def of_gpu(cls, gpu: Gpu) -> PhysicalDevice:
        """A whole GPU as an allocatable unit."""
        return cls(
            uuid=gpu.uuid,
            index_id=gpu.index_id,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            kind="gpu",
            product_name=gpu.product_name,
            memory_mib=gpu.memory_mib,
            multiprocessors=gpu.multiprocessors,
            minor=gpu.minor,
            numa_node=gpu.numa_node,
        )

    @classmethod
    def of_mig(cls, gpu: Gpu, mig: MigDevice) -> PhysicalDevice:
        """One MIG device of `gpu` as an allocatable unit (device nodes are the parent's)."""
        return cls(
            uuid=mig.uuid,
            index_id=mig.index_id,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            kind="mig",
            product_name=gpu.product_name,
            memory_mib=mig.memory_mib,
            multiprocessors=mig.multiprocessors,
            minor=gpu.minor,
            numa_node=gpu.numa_node,
            profile=mig.profile,
            gi_id=mig.gi_id,
            ci_id=mig.ci_id,
        )


@dataclass(frozen=True, slots=True)
class MpsShare:
    """Per-replica MPS limits, applied as daemon defaults and shown by `describe`."""

    active_thread_percentage: int
    """`set_default_active_thread_percentage`: 100 // replicas (integer division, as NVIDIA)."""
    pinned_memory_limit_mib: int | None
    """`set_default_device_pinned_mem_limit <index> <MiB>M`: memory // replicas; None on a
    unified-memory GPU (no memory figure to divide: no limit is set, only the SM share)."""

    @classmethod
    def even(cls, physical: PhysicalDevice, replicas: int) -> MpsShare:
        """One of `replicas` even MPS shares of `physical`, as NVIDIA's plugin divides it:
        the one rule the plan makes its MPS replicas by, and the default of a reader handed
        a device without its share (a DRA claim's, a hand-built plan's)."""
        n = max(replicas, 1)
        memory = physical.memory_mib // n if physical.memory_reported else None
        return cls(active_thread_percentage=100 // n, pinned_memory_limit_mib=memory)


@dataclass(frozen=True, slots=True)
class AdvertisedDevice:
    id: DeviceId
    physical: PhysicalDevice
    replica: int | None
    """Replica number, or None when the physical device is handed out whole."""
    replicas: int
    """How many advertised devices of this resource share `physical` (1 = exclusive)."""
    mps: MpsShare | None = None
    entitlement_mib: int | None = None
    """The memory its holder is entitled to when that is not `physical.memory_mib / replicas`:
    a DRA share's consumed capacity, which the scheduler sized per claim."""


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    name: ResourceName
    """Advertised name (after rename / renameByDefault)."""
    label_name: ResourceName
    """Name before renaming; GFD keys its labels by it."""
    strategy: SharingStrategy
    fail_requests_greater_than_one: bool
    devices: tuple[AdvertisedDevice, ...]

    @property
    def renamed(self) -> bool:
        return self.name != self.label_name

    @property
    def short_name(self) -> str:
        """`nvidia.com/gpu.shared` -> `gpu.shared`: what NVIDIA puts in socket file names."""
        return self.name.split("/", 1)[1] if "/" in self.name else self.name

    @property
    def socket_name(self) -> str:
        """`nvidia-gpu.shared.sock`, the file name NVIDIA's plugin uses."""
        return f"nvidia-{self.short_name}.sock"

    def physical_devices(self) -> tuple[PhysicalDevice, ...]:
        seen: dict[str, PhysicalDevice] = {}
        for dev in self.devices:
            seen.setdefault(dev.physical.uuid, dev.physical)
        return tuple(seen.values())


@dataclass(frozen=True, slots=True)
class AllocateSettings:
    """The config flags that shape Allocate responses (NVIDIA's names in the comments)."""

    device_list_strategies: tuple[DeviceListStrategy, ...] = ("envvar",)
    """`flags.plugin.deviceListStrategy`."""
    device_id_strategy: DeviceIdStrategy = "uuid"
    """`flags.plugin.deviceIDStrategy`."""
    pass_device_specs: bool = False
    """`flags.plugin.passDeviceSpecs`: add `/dev/nvidia*` device specs."""
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    """`flags.plugin.cdiAnnotationPrefix`."""
    nvidia_dev_root: str = "/"
    """`flags.nvidiaDevRoot` (falls back to `nvidiaDriverRoot`): host prefix of `/dev`."""
    mps_root: str = ""
    """`flags.mpsRoot`: host directory holding each MPS resource's pipe and shm dirs."""
    allocation_policy: AllocationPolicy = "distributed"
    """`flags.plugin.sharedDevicesAllocationPolicy`."""
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    imex_channels: tuple[int, ...] = ()
    """`imex.channelIDs` whose device node exists on the host (the agent checks; NVIDIA
    skips a missing channel unless `imex.required`, when it refuses to start)."""
    memory_soft_limits: bool = False
    """Not a config field: `HostFacts.memory_soft_limits` (the agent's `--memory-soft-limits`)
    puts it here. A plan of the config alone (no host facts) answers exactly as NVIDIA's
    plugin does, so it is off there. Time-sliced replicas get env hints with their memory
    share (`core.allocation.softlimits`)."""


SOFT_LIMITS_DEFAULT = True
"""The one default of `--memory-soft-limits` (`MEMORY_SOFT_LIMITS`): the agent's setting,
`gpuslice describe` and the demo all take it from here."""


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What a node's plan needs besides its inventory and config: facts looked up on the
    host (which IMEX channels exist) and the agent's own flags that shape Allocate. The
    adapter gathers them (`agent.plan.host_facts`); the core only reads them, so the plan
    the daemon serves and the one `gpuslice describe` prints come from one function."""

    imex_channels: tuple[int, ...]
    """The configured `imex.channelIDs` whose device node exists on the host."""
    memory_soft_limits: bool = SOFT_LIMITS_DEFAULT


@dataclass(frozen=True, slots=True)
class Plan:
    resources: tuple[ResourcePlan, ...]
    allocate: AllocateSettings = field(default_factory=AllocateSettings)
    mig_strategy: MigStrategy = "none"
    warnings: tuple[str, ...] = ()
    mig_strategy_warnings: tuple[str, ...] = ()
    """Those of `warnings` about how `migStrategy` advertises MIG GPUs: advice for the
    device plugin only (DRA mode publishes MIG devices as they are)."""
    mig_layout_problem: str | None = None
    """Why `single` cannot serve this node's MIG layout (nothing is advertised for it then,
    and the labels say `-MIG-INVALID`), or None."""
    dynamic_mig: tuple[str, ...] = ()
    """The GPUs `flags.dynamicMig` marks (`all`, indices, UUIDs): in DRA mode they publish
    MIG partitions (`core.dra.partitions.is_dynamic`); the device plugin ignores it."""

    def counts(self) -> dict[str, int]:
        return {r.name: len(r.devices) for r in self.resources}

    def resource(self, name: str) -> ResourcePlan | None:
        for r in self.resources:
            if r.name == name:
                return r
        return None
