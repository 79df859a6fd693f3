"""What this node publishes as a DRA driver: devices named and described as NVIDIA's does.

Users' DeviceClasses and claims select GPUs by CEL over attributes, so the names are
NVIDIA's `gpu.nvidia.com` ones (REFERENCE-DRA §5.2): a selector such as
`device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'` selects the
same GPUs under gpuslice. Devices are `gpu-<minor>` for whole GPUs and
`gpu-<parent minor>-mig-<profile without dots>-<GI profile ID>-<placement start>` for MIG
devices. A GPU in MIG mode is published as its MIG devices only (NVIDIA's driver also
published the whole GPU, kubernetes-sigs/dra-driver-nvidia-gpu#719).

Kubernetes' standard attributes (`resource.kubernetes.io/pciBusID`, `pcieRoot`, `numaNode`)
go on every device, MIG devices carrying their parent's, so claims can align GPUs with NICs.

Health becomes device taints (NVIDIA's keys under the driver's domain): an XID taints with
its code, a lost GPU with `gpu-lost`; both `NoSchedule`, so running pods stay and new
claims go elsewhere. An ignored XID gets the `xid` taint with effect `None` (informational),
and an operator's cordon (`core.cordon`) the `gpuslice.io/gpu-cordon` taint, `NoSchedule`.

Everything here produces the `resource.k8s.io/v1` JSON shapes the API holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpuslice.core.cordon import CORDON_TAINT
from gpuslice.core.devices import Gpu, Inventory, MigDevice
from gpuslice.core.dra.resource_slice import StoredSlice
from gpuslice.core.jsontypes import Json
from gpuslice.core.labels import gpu_family
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB, canonical_quantity

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
"""The API's limit once any device of a slice has taints or consumes counters (1.35+)."""
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_ATTRIBUTES = 32
"""Attributes plus capacities per device."""
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

SHARES_CAPACITY = "shares"
"""The capacity counting a shared GPU's shares, in the driver's domain
(`gpu.nvidia.com/shares`), as NVIDIA's `ConsumableShares` count mode names it."""
CORES_CAPACITY = "cores"
"""A shared GPU's compute, in percent of its SMs (0..100), as HAMi's DRA driver names and
counts it (NVIDIA's driver has none), so a claim written for HAMi (`cores: 30`) asks the same
here. Under MPS a claim's cores become its clients' active thread percentage; time-slicing
cannot hold a process to a fraction of the SMs, so there it is only bookkeeping for the
scheduler."""
NUMA_NODE = "resource.kubernetes.io/numaNode"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
"""The GPU's PCIe root complex (`pci0000:64`), Kubernetes' standard attribute: a claim's
`matchAttribute` on it puts a GPU and a NIC (or two GPUs) under one root."""

AttrKind = Literal["string", "int", "bool", "version"]
SharesKind = Literal["replicas", "disabled", "memory", "unlimited", "count"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

# `nvidia-smi mig -lgip` profile IDs by GPU-instance shape (REFERENCE.md §2.2): the same on
# A100, H100 and H200 (not on A30: a GPU's own table comes first, `gi_profile_id`). Keyed by
# (compute slices, placement size, media-extensions variant).
GI_PROFILE_IDS = {
    (1, 1, "+me"): 20,
    (1, 1, ""): 19,
    (1, 2, ""): 15,
    (2, 2, ""): 14,
    (3, 4, ""): 9,
    (4, 4, ""): 5,
    (7, 8, ""): 0,
}


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device this node offers, with what Prepare needs to find it again."""

    name: str
    kind: Literal["gpu", "mig"]
    uuid: str
    """The GPU's or the MIG device's own UUID (what `NVIDIA_VISIBLE_DEVICES` takes)."""
    gpu: Gpu
    """The physical GPU (its minor, for device nodes; its UUID, for health and MPS)."""
    mig: MigDevice | None
    attributes: Mapping[str, tuple[AttrKind, str | int | bool]]
    capacity: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class SharesMode:
    """Which devices DRA offers as consumable shares, and how (`--consumable-shares`).

    `replicas` (the default) is gpuslice's own: the GPUs the node's config shares, N ways
    for `replicas: N`. The others are NVIDIA's `--consumable-shares` values with NVIDIA's
    meaning, for every GPU and MIG device of the node: `disabled` (none), `memory` (a claim
    that asks for nothing takes all the memory), `unlimited` (it takes none) and a positive
    integer N (`count`: N shares, one by default, and no memory unless asked)."""

    kind: SharesKind = "replicas"
    count: int = 0
    """N, for `count`."""

    @classmethod
    def parse(cls, text: str) -> SharesMode:
        """The flag's value; ValueError naming it otherwise (the daemon refuses to start
        rather than publish something else than the operator asked)."""
        value = text.strip()
        if value in ("replicas", "disabled", "memory", "unlimited"):
            return cls(value)  # type: ignore[arg-type]
        if value.isascii() and value.isdigit() and int(value) > 0:
            return cls("count", int(value))
        raise ValueError(
            f"--consumable-shares {text!r}: must be 'replicas', 'disabled', 'memory', "
            "'unlimited' or a positive integer"
        )

    def __str__(self) -> str:
        return str(self.count) if self.kind == "count" else self.kind


REPLICAS = SharesMode()


@dataclass(frozen=True, slots=True)
class ShareOffer:
    """A device this node offers as consumable shares. In `replicas` mode the node's config
    shares it N ways (`replicas`), so N claims that ask for nothing each get one share and
    memory/N; the other modes are NVIDIA's (`SharesMode`)."""

    replicas: int
    """The `shares` capacity (N); 1 where the mode publishes none (`memory`, `unlimited`)."""
    strategy: SharingStrategy
    """TIME_SLICING or MPS (never NONE: a device not shared is not offered)."""
    memory_mib: int
    mode: SharesKind = "replicas"

    @property
    def counted(self) -> bool:
        """Whether the device publishes a `shares` capacity."""
        return self.mode in ("replicas", "count")

    @property
    def default_memory_mib(self) -> int:
        """The memory a share holds when its claim asks for none: the one rule the slice
        publishes as the memory's default and Prepare reads where the scheduler recorded no
        consumed memory, so the two cannot differ. `replicas` mode: memory / N; NVIDIA's
        `memory` mode: all of it; `unlimited` and `count`: nothing. 0 on a unified-memory
        GPU (no memory figure, no memory capacity)."""
        if self.mode == "replicas":
            return self.memory_mib // self.replicas
        return self.memory_mib if self.mode == "memory" else 0


def semver(text: str) -> str:
    """NVIDIA's version normalisation: numeric parts without leading zeros, padded to three
    (`580.95.05` -> `580.95.5`, `8.0` -> `8.0.0`)."""
    parts = [str(int(p)) for p in re.findall(r"\d+", text)[:3]]
    return ".".join([*parts, "0", "0", "0"][:3])


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version (`12040`) as semver (`12.4.0`)."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}.0"


def gi_profile_id(mig: MigDevice, gpu: Gpu | None = None) -> int | None:
    """The profile ID NVML gives `mig`'s profile on `gpu`: the GPU's own table's where it
    has one (IDs are per model: an A30's `2g.12gb` is 5, an A100's `2g.10gb` 14), else the
    8-slice GPUs' ID for its shape."""
    geometry = gpu.mig_geometry if gpu is not None else None
    known = geometry.profile(mig.profile) if geometry is not None else None
    if known is not None and known.profile_id is not None:
        return known.profile_id
    variant = "+me" if mig.profile.endswith("+me") else ""
    return GI_PROFILE_IDS.get((mig.slices_gi, mig.placement_size, variant))


def mig_device_name(gpu: Gpu, mig: MigDevice) -> str:
    # NVIDIA's spelling: dots dropped, `+` (media extensions) as `-`: `1g10gb-me`
    profile = re.sub(r"[^a-z0-9-]", "", mig.profile.lower().replace("+", "-"))
    pid = gi_profile_id(mig, gpu)
    # an unknown shape (new GPUs) keeps a unique, stable name from the GI ID instead
    ident = str(pid) if pid is not None else f"gi{mig.gi_id}"
    return f"gpu-{gpu.minor}-mig-{profile}-{ident}-{mig.placement_start}"


def _common(gpu: Gpu, inventory: Inventory) -> dict[str, tuple[AttrKind, str | int | bool]]:
    major, minor = gpu.compute_capability
    attrs: dict[str, tuple[AttrKind, str | int | bool]] = {
        "productName": ("string", gpu.product_name),
        "brand": ("string", _brand(gpu.product_name)),
        "architecture": ("string", _architecture(gpu.compute_capability)),
        "cudaComputeCapability": ("version", f"{major}.{minor}.0"),
        "driverVersion": ("version", semver(inventory.driver_version)),
        "cudaDriverVersion": ("version", cuda_version(inventory.cuda_driver_version)),
    }
    if gpu.pci_bus_id:
        attrs[PCI_BUS_ID] = ("string", _extended_bdf(gpu.pci_bus_id))
    if gpu.pcie_root:
        attrs[PCIE_ROOT] = ("string", gpu.pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs[NUMA_NODE] = ("int", gpu.numa_node)
    return attrs


common_attributes = _common
"""The attributes every device of `gpu` carries (partitions too, `core.dra.partitions`)."""


def dra_devices(inventory: Inventory) -> tuple[DraDevice, ...]:
    out: list[DraDevice] = []
    for gpu in inventory.gpus:
        common = _common(gpu, inventory)
        if gpu.mig_enabled:
            for mig in gpu.mig_devices:
                attrs: dict[str, tuple[AttrKind, str | int | bool]] = {
                    "type": ("string", "mig"),
                    "uuid": ("string", mig.uuid),
                    "parentUUID": ("string", gpu.uuid),
                    "profile": ("string", mig.profile),
                    **common,
                }
                capacity = {
                    "multiprocessors": mig.multiprocessors,
                    "copyEngines": mig.engines_copy,
                    "decoders": mig.engines_decoder,
                    "encoders": mig.engines_encoder,
                    "jpegEngines": mig.engines_jpeg,
                    "ofaEngines": mig.engines_ofa,
                    "memory": mig.memory_mib * MIB,
                }
                for slot in range(mig.placement_start, mig.placement_start + mig.placement_size):
                    capacity[f"memorySlice{slot}"] = 1
                name = mig_device_name(gpu, mig)
                out.append(DraDevice(name, "mig", mig.uuid, gpu, mig, attrs, capacity))
            continue
        whole: dict[str, tuple[AttrKind, str | int | bool]] = {
            "type": ("string", "gpu"),
            "uuid": ("string", gpu.uuid),
            **common,
        }
        # No memory capacity where NVML reports none (unified memory), as NVIDIA's driver.
        capacity = {"memory": gpu.memory_mib * MIB} if gpu.memory_reported else {}
        out.append(DraDevice(f"gpu-{gpu.minor}", "gpu", gpu.uuid, gpu, None, whole, capacity))
    _check(out)
    return tuple(out)


def _check(devices: Sequence[DraDevice]) -> None:
    seen: set[str] = set()
    for d in devices:
        if not _DNS_LABEL.match(d.name):
            raise ValueError(f"device name {d.name!r} is not a DNS label")
        if d.name in seen:
            raise ValueError(f"device name {d.name!r} is not unique on this node")
        seen.add(d.name)
        if len(d.attributes) + len(d.capacity) > MAX_ATTRIBUTES:
            raise ValueError(f"device {d.name}: more than {MAX_ATTRIBUTES} attributes+capacities")
        for key, (_kind, value) in d.attributes.items():
            if isinstance(value, str) and len(value) > 64:
                raise ValueError(f"device {d.name}: attribute {key} longer than 64 characters")


@dataclass(frozen=True, slots=True)
class Health:
    """Why devices are tainted: GPU UUID -> last XID (None: lost, or unhealthy otherwise);
    `noticed`: physical UUID -> an ignored XID seen on it (informational); `cordoned`:
    physical UUIDs the operator cordoned (`core.cordon`)."""

    unhealthy: Mapping[str, int | None]
    noticed: Mapping[str, int] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    unmonitored: frozenset[str] = frozenset()
    """GPU UUIDs whose health events could not be registered (`core.health.Unmonitored`)."""


def taints(device: DraDevice, health: Health, driver: str, added: str) -> list[Json]:
    """NVIDIA's health taints for `device`: `NoSchedule` when it or its physical GPU is
    unhealthy; otherwise, after an ignored XID, the same `xid` key with effect `None`
    (NVIDIA's informational taint: seen by operators and tolerations, no effect on
    scheduling; Kubernetes 1.35+). One taint per key, as NVIDIA's: the unhealthy one wins."""
    uuid = device.uuid if device.uuid in health.unhealthy else device.gpu.uuid
    if uuid not in health.unhealthy:
        noticed = health.noticed.get(device.uuid, health.noticed.get(device.gpu.uuid))
        if noticed is None:
            return []
        info = {"key": f"{driver}/xid", "value": str(noticed), "effect": "None"}
        return [{**info, "timeAdded": added}]
    xid = health.unhealthy[uuid]
    if xid is None:
        return [{"key": f"{driver}/gpu-lost", "effect": "NoSchedule", "timeAdded": added}]
    return [{"key": f"{driver}/xid", "value": str(xid), "effect": "NoSchedule", "timeAdded": added}]


def unmonitored_taints(device: DraDevice, health: Health, driver: str, added: str) -> list[Json]:
    """NVIDIA's `<driver>/unmonitored` taint, effect `None` and no value, on every device of
    a GPU whose health events could not be registered: an XID there would go unseen, which
    operators and tolerations can see, while scheduling is left alone (as NVIDIA's driver)."""
    if device.gpu.uuid in health.unmonitored:
        return [{"key": f"{driver}/unmonitored", "effect": "None", "timeAdded": added}]
    return []


def cordon_taints(device: DraDevice, health: Health, added: str) -> list[Json]:
    """The operator's cordon (`gpuslice.io/gpu-cordon`) as a `NoSchedule` taint: no new
    claim gets the device, claims already allocated keep it (`core.cordon`)."""
    if device.uuid in health.cordoned or device.gpu.uuid in health.cordoned:
        return [{"key": CORDON_TAINT, "effect": "NoSchedule", "timeAdded": added}]
    return []


def device_json(
    device: DraDevice, device_taints: Sequence[Json], offer: ShareOffer | None = None
) -> Json:
    """The device as the API holds it. An offered device allows many allocations, each
    consuming what its request asks for, else the policy's default (consumable capacity,
    Kubernetes' DRAConsumableCapacity): in `replicas` mode one share and memory/N; in
    NVIDIA's modes what NVIDIA's `--consumable-shares` publishes. Every offered device also
    has `cores` (default 0: a claim reserves compute only by asking for it)."""
    capacity: Json = {
        k: {"value": canonical_quantity(v)} for k, v in sorted(device.capacity.items())
    }
    out: Json = {
        "name": device.name,
        "attributes": {k: {kind: v} for k, (kind, v) in sorted(device.attributes.items())},
        "capacity": capacity,
    }
    if offer is not None and (offer.replicas > 1 or offer.mode != "replicas"):
        out["allowMultipleAllocations"] = True
        for name, value in device.capacity.items():
            if name != "memory" and value > 0:
                # a MIG device's engines and memory slices: without a policy each allocation
                # would consume all of them (KEP-5075), and the device could be held by one
                # claim only; they describe the device, they are not what shares divide.
                # (A capacity of 0 takes no policy: the API refuses a step above the value,
                # and consuming all of nothing holds nothing.)
                capacity[name]["requestPolicy"] = {
                    "default": "0",
                    "validRange": {"min": "0", "max": canonical_quantity(value), "step": "1"},
                }
        memory = device.capacity.get("memory", offer.memory_mib * MIB)
        if memory <= 0:
            pass  # a unified-memory GPU reports no memory: shared by count (and cores) only
        elif offer.mode == "replicas":
            capacity["memory"] = {
                "value": canonical_quantity(memory),
                "requestPolicy": {
                    "default": canonical_quantity(offer.default_memory_mib * MIB, binary=True),
                    "validRange": {"min": "1Mi", "step": "1Mi"},
                },
            }
        else:
            # NVIDIA's: the value rounded down to whole MiB (max and default must be
            # multiples of the step, or the API server refuses the slice)
            whole = canonical_quantity(memory // MIB * MIB, binary=True)
            everything = offer.mode == "memory"
            low = "1Mi" if everything else "0"
            capacity["memory"] = {
                "value": whole,
                "requestPolicy": {
                    "default": whole if everything else "0",
                    "validRange": {"min": low, "max": whole, "step": "1Mi"},
                },
            }
        if offer.counted:
            capacity[SHARES_CAPACITY] = {
                "value": canonical_quantity(offer.replicas),
                "requestPolicy": {
                    "default": "1",
                    "validRange": {
                        "min": "1",
                        "max": canonical_quantity(offer.replicas),
                        "step": "1",
                    },
                },
            }
        capacity[CORES_CAPACITY] = {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        }
    if device_taints:
        out["taints"] = list(device_taints)
    return out


def slice_specs(
    devices: Iterable[Json],
    *,
    driver: str,
    node: str,
    generation: int,
    counter_sets: Sequence[Json] = (),
) -> list[Json]:
    """The `spec`s of this node's slices: one pool named after the node, at most 128
    devices per slice (64 once any device in it has taints or consumes counters), in device
    order, then the counter sets of dynamic MIG GPUs (`core.dra.partitions`) in slices of
    their own (the API takes a slice's devices or its counter sets, never both)."""
    pending = list(devices)
    chunks: list[tuple[list[Json], list[Json]]] = []
    while pending:
        limit = MAX_DEVICES_PER_SLICE
        head = pending[:MAX_DEVICES_PER_SLICE]
        if any("taints" in d or "consumesCounters" in d for d in head):
            limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS
        chunks.append((pending[:limit], []))
        pending = pending[limit:]
    sets = list(counter_sets)
    while sets:
        chunks.append(([], sets[:MAX_COUNTER_SETS_PER_SLICE]))
        sets = sets[MAX_COUNTER_SETS_PER_SLICE:]
    if not chunks:
        chunks = [([], [])]  # an empty pool still says "this node has no devices of ours"
    out: list[Json] = []
    for chunk, counters in chunks:
        spec: Json = {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
        }
        if counters:
            spec["sharedCounters"] = counters
        else:
            spec["devices"] = chunk
        out.append(spec)
    return out


@dataclass(frozen=True, slots=True)
class SliceChanges:
    """What to do in the API so this node's slices become the wanted ones."""

    create: tuple[Json, ...]
    update: tuple[Json, ...]
    """Existing slice objects (name, resourceVersion kept) with their new spec."""
    delete: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def plan_slices(
    existing: Sequence[Json],
    devices: Sequence[Json],
    *,
    driver: str,
    node: str,
    node_uid: str,
    counter_sets: Sequence[Json] = (),
) -> SliceChanges:
    """Compare what the API holds with what should be published. Unchanged devices cost
    nothing; any change publishes every slice at a generation above all existing ones (the
    scheduler uses only the highest generation of a pool, so no slice is ever mixed in from
    an older generation)."""
    current = sorted((StoredSlice.read(o) for o in existing), key=lambda s: s.name)
    generation = max((s.generation or 0 for s in current), default=0)
    wanted_same = slice_specs(
        devices, driver=driver, node=node, generation=generation, counter_sets=counter_sets
    )
    if [s.spec for s in current] == wanted_same:
        return SliceChanges((), (), ())
    wanted = slice_specs(
        devices, driver=driver, node=node, generation=generation + 1, counter_sets=counter_sets
    )
    update = [dict(s.obj, spec=spec) for s, spec in zip(current, wanted, strict=False)]
    create = [
        _new_slice(spec, i, driver=driver, node=node, node_uid=node_uid)
        for i, spec in enumerate(wanted)
    ][len(current) :]
    delete = [s.name for s in current[len(wanted) :]]
    return SliceChanges(tuple(create), tuple(update), tuple(delete))


def _new_slice(spec: Json, index: int, *, driver: str, node: str, node_uid: str) -> Json:
    metadata: Json = {"generateName": f"{node}-{driver}-{index:02x}-"}
    if node_uid:  # slices go with their Node (garbage collection)
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": spec,
    }


def _brand(product: str) -> str:
    """NVML's brand as NVIDIA's driver spells it, from the product name (the inventory does
    not carry NVML's brand): `Tesla T4` -> Tesla, `NVIDIA RTX A6000` -> NvidiaRTX, data
    centre GPUs (`NVIDIA H100 80GB HBM3`) -> Nvidia."""
    words = product.replace("NVIDIA ", "").split()
    first = words[0].lower() if words else ""
    rtx = len(words) > 1 and words[1].upper() == "RTX"
    for brand in ("Tesla", "Quadro", "GeForce", "Titan"):
        if first == brand.lower():
            return f"{brand}RTX" if rtx and brand != "Tesla" else brand
    if first == "rtx":
        return "NvidiaRTX"
    return "Nvidia"


def _architecture(cc: tuple[int, int]) -> str:
    """NVIDIA's spelling (`Hopper`, `Ampere`, `Ada Lovelace`), from GFD's family name."""
    family = gpu_family(cc)
    if family == "undefined":
        return "Unknown"
    return " ".join(w.capitalize() for w in family.split("-"))


def _extended_bdf(bus_id: str) -> str:
    """`dddd:bb:dd.f` lowercase, from NVML's `00000000:04:00.0` or a short form."""
    text = bus_id.lower()
    domain, _, rest = text.rpartition(":")
    if "." in rest and domain.count(":") == 1:
        dom, bus = domain.split(":")
        return f"{int(dom, 16):04x}:{bus}:{rest}"
    return text
