"""The node's GPU inventory as plain, frozen data.

Backends (NVML, simulated) produce an `Inventory`; everything else in the core reads it.
Nothing here talks to a device: the model is what the sharing plan, the labels and the
allocation policy are computed from, so it must be complete enough that none of them need
to ask the hardware again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NewType

if TYPE_CHECKING:  # gpumodels imports this module
    from gpuslice.core.gpumodels import MigGeometry

GpuUuid = NewType("GpuUuid", str)
"""`GPU-xxxxxxxx-...` as NVML reports it."""

MigUuid = NewType("MigUuid", str)
"""`MIG-xxxxxxxx-...` as NVML reports it (R470+ form)."""

P2PLevel = Literal[
    "same-board", "single-switch", "multi-switch", "host-bridge", "same-cpu", "cross-cpu"
]
"""How two GPUs reach each other over PCIe, from NVML's topology common ancestor."""


PCI_CLASS_VGA = 0x030000
PCI_CLASS_3D = 0x030200


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device: a GPU instance with a single compute instance spanning it."""

    uuid: MigUuid
    parent_uuid: GpuUuid
    parent_index: int
    index: int
    """Position of this MIG device under its parent: the `j` in the index form `i:j`."""
    profile: str
    """Canonical profile name, e.g. `1g.10gb`, `1g.10gb+me`, `1c.3g.20gb`."""
    gi_id: int
    ci_id: int
    memory_mib: int
    multiprocessors: int
    slices_gi: int
    slices_ci: int
    placement_start: int
    placement_size: int
    engines_copy: int = 0
    engines_decoder: int = 0
    engines_encoder: int = 0
    engines_jpeg: int = 0
    engines_ofa: int = 0
    cap_minors: tuple[int, int] | None = None
    """The minors of its GPU instance's and compute instance's capability device nodes
    (`/dev/nvidia-caps/nvidia-cap<N>`, `core.migcaps`), which a container needs to use it;
    None where the backend could not read them."""
    cap_major: int | None = None
    """The `nvidia-caps` character major (`/proc/devices`): with it the CDI spec has the
    runtime create the capability nodes in the container, as NVIDIA's does; None: it names
    the host's nodes instead."""

    @property
    def index_id(self) -> str:
        """The index-strategy ID NVIDIA uses for MIG devices: `<gpu>:<mig>`."""
        return f"{self.parent_index}:{self.index}"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU."""

    index: int
    uuid: GpuUuid
    product_name: str
    """Exactly as NVML's `nvmlDeviceGetName` returns it, e.g. `Tesla T4`."""
    memory_mib: int
    """Total memory as NVML reports it; 0 where NVML does not (see `memory_reported`)."""
    multiprocessors: int
    compute_capability: tuple[int, int]
    pci_bus_id: str
    """NVML's 8-digit-domain form, e.g. `00000000:07:00.0`."""
    minor: int
    """`/dev/nvidia<minor>`."""
    numa_node: int | None = None
    pcie_root: str | None = None
    """The PCIe root complex the GPU hangs under, as sysfs names it (`pci0000:00`): the
    first directory of `/sys/bus/pci/devices/<bus id>`'s target under `/sys/devices`.
    Devices under the same root (a GPU and a NIC) reach each other without crossing the
    CPU interconnect, so DRA claims align them on it. None when it could not be read."""
    mig_capable: bool = False
    mig_enabled: bool = False
    """Current MIG mode (what the driver runs now)."""
    mig_pending: bool = False
    """Pending MIG mode (takes effect after a GPU reset)."""
    mig_devices: tuple[MigDevice, ...] = ()
    pci_device_id: int = 0
    """PCI device ID as NVML reports it (`0x20B010DE`): mig-parted keys its tables on it."""
    pci_class: int | None = PCI_CLASS_3D
    """24-bit PCI class code from sysfs: `0x030000` VGA controller (GeForce cards with a
    display), `0x030200` 3D controller (data-centre cards). None when it could not be read.
    GFD's `nvidia.com/gpu.mode` comes from it."""
    mig_geometry: MigGeometry | None = None
    """The MIG profiles and placements the GPU offers (NVML's profile and placement
    queries; the simulator's tables): what dynamic MIG publishes as partitions
    (`core.dra.partitions`). None on a GPU without MIG, or where the backend could not
    read them."""

    @property
    def index_id(self) -> str:
        return str(self.index)

    @property
    def memory_reported(self) -> bool:
        """False on a unified-memory GPU (GB10 / DGX Spark, Jetson Thor): NVML answers
        NOT_SUPPORTED for its memory, so `memory_mib` is 0 and nothing may be sized from it
        (labels, memory capacities, MPS limits, the guard); sharing by count still works."""
        return self.memory_mib > 0


@dataclass(frozen=True, slots=True)
class Link:
    """How two GPUs are connected. Used to keep multi-GPU requests on well-linked sets."""

    a: GpuUuid
    b: GpuUuid
    p2p: P2PLevel
    nvlinks: int = 0


@dataclass(frozen=True, slots=True)
class Inventory:
    """Everything known about the node's GPUs at one moment."""

    gpus: tuple[Gpu, ...]
    driver_version: str
    """e.g. `550.54.15`."""
    cuda_driver_version: int
    """NVML's integer form, e.g. `12040` for 12.4."""
    links: tuple[Link, ...] = field(default=())
    machine_type: str = "unknown"
    """DMI product name, for the `gpu.machine` label."""

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None

    def mig_devices(self) -> tuple[MigDevice, ...]:
        return tuple(m for g in self.gpus for m in g.mig_devices)

    def link(self, a: str, b: str) -> Link | None:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        return None


def memory_gib(mib: int) -> float:
    return mib / 1024.0
