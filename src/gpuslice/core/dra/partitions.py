"""Dynamic MIG as partitionable devices (KEP-4815): what a GPU marked dynamic publishes.

A static MIG GPU publishes the instances someone already made. A dynamic one publishes what
it *could* hold: one device per MIG profile and placement, all drawing on one counter set
per GPU. The scheduler then picks, per claim, a device whose counters are still free, and
Prepare creates that instance (`agent.dynamic_mig`). Overlapping placements exclude each
other because they consume the same `memory-slice-<N>` counters.

The counters are NVIDIA's (`cmd/gpu-kubelet-plugin/partitions.go` in its DRA driver): one
per capacity of a GPU instance profile (`multiprocessors`, `copy-engines`, `decoders`,
`encoders`, `jpeg-engines`, `ofa-engines`, `memory`), each as large as the largest profile
has it, and one of value 1 per memory slice. gpuslice adds `compute-slices`: the driver's
real limit (7 on 8-slice GPUs, 4 on A30), which the multiprocessor counter only
approximates. The engines carry the other placement rules: the one OFA unit is why only
one `+me` instance fits.

Device names are the static ones (`gpu-<minor>-mig-<profile>-<GI profile id>-<start>`), so
a claim written for a static layout's device names the same instance here; the devices have
no `uuid` attribute (the instance does not exist until Prepare).

The API's limits (resource.k8s.io/v1, checked against kube-apiserver 1.36 by the real-server
tests): a slice holds devices or counter sets, never both; at most 8 counter sets per slice
and 32 counters per set; at most 64 devices in a slice once any consumes counters (or has
taints); at most 32 counters per consumption, 2 consumptions per device.

The whole GPU is not published: a dynamic GPU is in MIG mode, where CUDA runs only inside
MIG devices, and gpuslice never changes MIG mode. NVIDIA's driver publishes it only where it
toggles MIG mode itself without a GPU reset (Hopper and later: on for a MIG device, off once
none is left), never on an Ampere GPU in MIG mode (`nvlib.go`, `maybeDisableMigMode`).

Instances already on the GPU that gpuslice did not create for a claim (`foreign`: made by an
operator, another tool, or an earlier layout) are taken out: the counter set shrinks by what
they hold, and the partitions they overlap, or that need more of a counter than is left (a
`+me` once someone else's `+me` holds the one OFA unit), are not published. So every counter
a published device consumes is in its set, with enough of it: the scheduler refuses the
whole pool, every GPU of the node, when one is not. A GPU they fill publishes nothing, not
even its counter set (the API refuses a set without counters). Instances gpuslice created
are the scheduler's allocations and are already counted by it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.core.devices import Gpu, Inventory, MigDevice
from gpuslice.core.dra.publish import GI_PROFILE_IDS, AttrKind, DraDevice, common_attributes
from gpuslice.core.gpumodels import MigGeometry, MigProfile
from gpuslice.core.jsontypes import Json
from gpuslice.core.units import MIB, canonical_quantity

MAX_COUNTERS_PER_SET = 32
MAX_COUNTERS_PER_CONSUMPTION = 32

_CAPACITY_COUNTERS = (
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg-engines"),
    ("ofaEngines", "ofa-engines"),
)
"""(device capacity name, counter name): counters must be DNS labels, so NVIDIA's camel-case
capacities become hyphenated counters."""
COMPUTE_SLICES = "compute-slices"


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


@dataclass(frozen=True, slots=True)
class Partition:
    """One MIG device a dynamic GPU can hold: a profile at one placement start."""

    gpu: Gpu
    profile: MigProfile
    start: int
    name: str

    @property
    def slots(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)

    def capacity(self) -> dict[str, int]:
        """The device's capacities, as a static MIG device of that profile has them."""
        p = self.profile
        out = {
            "multiprocessors": p.multiprocessors,
            "copyEngines": p.copy_engines,
            "decoders": p.decoders,
            "encoders": p.encoders,
            "jpegEngines": p.jpeg,
            "ofaEngines": p.ofa,
            "memory": p.memory_mib * MIB,
        }
        for slot in self.slots:
            out[f"memorySlice{slot}"] = 1
        return out

    def consumes(self) -> dict[str, int]:
        return profile_consumption(self.profile, self.start)


def profile_consumption(profile: MigProfile, start: int) -> dict[str, int]:
    """The counters an instance of `profile` at `start` holds."""
    values = {
        "multiprocessors": profile.multiprocessors,
        "copy-engines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpeg-engines": profile.jpeg,
        "ofa-engines": profile.ofa,
        "memory": profile.memory_mib * MIB,
        COMPUTE_SLICES: profile.compute_slices,
    }
    for slot in range(start, start + profile.memory_slices):
        values[memory_slice_counter(slot)] = 1
    return values


def full_counters(geometry: MigGeometry) -> dict[str, int]:
    """The GPU's counter set before anything is allocated: per capacity the largest any
    profile has (the whole-GPU profile's, in practice), every memory slice once."""
    out: dict[str, int] = {}
    for profile in geometry.profiles:
        for name, value in profile_consumption(profile, 0).items():
            if not name.startswith("memory-slice-"):
                out[name] = max(out.get(name, 0), value)
    out[COMPUTE_SLICES] = geometry.compute_slices
    for slot in range(geometry.memory_slices):
        out[memory_slice_counter(slot)] = 1
    return out


def foreign_consumption(geometry: MigGeometry, foreign: Iterable[MigDevice]) -> dict[str, int]:
    """What instances gpuslice did not create hold of the counters: their profile's
    consumption at their placement, or (a profile the geometry does not know) their own
    figures."""
    used: dict[str, int] = {}
    for mig in foreign:
        profile = geometry.profile(mig.profile)
        if profile is not None and mig.placement_size == profile.memory_slices:
            values = profile_consumption(profile, mig.placement_start)
        else:
            values = {
                "multiprocessors": mig.multiprocessors,
                "copy-engines": mig.engines_copy,
                "decoders": mig.engines_decoder,
                "encoders": mig.engines_encoder,
                "jpeg-engines": mig.engines_jpeg,
                "ofa-engines": mig.engines_ofa,
                "memory": mig.memory_mib * MIB,
                COMPUTE_SLICES: mig.slices_gi,
            }
            start = max(mig.placement_start, 0)
            for slot in range(start, start + max(mig.placement_size, 0)):
                values[memory_slice_counter(slot)] = 1
        for name, value in values.items():
            used[name] = used.get(name, 0) + value
    return used


def available_counters(geometry: MigGeometry, foreign: Iterable[MigDevice] = ()) -> dict[str, int]:
    full = full_counters(geometry)
    used = foreign_consumption(geometry, foreign)
    return {name: max(0, value - used.get(name, 0)) for name, value in full.items()}


def partitions(
    gpu: Gpu, geometry: MigGeometry, foreign: Iterable[MigDevice] = ()
) -> tuple[Partition, ...]:
    """Every profile at every placement start the GPU offers, less those a foreign
    instance overlaps; in the table's order (small profiles first) and start order, which
    is the order the scheduler tries them in."""
    taken: set[int] = set()
    for mig in foreign:
        taken.update(_held(mig))
    out: list[Partition] = []
    for profile in geometry.profiles:
        for start in sorted(profile.starts):
            slots = set(range(start, start + profile.memory_slices))
            if slots & taken or start + profile.memory_slices > geometry.memory_slices:
                continue
            out.append(Partition(gpu, profile, start, partition_name(gpu, profile, start)))
    return tuple(out)


def gi_profile_id(profile: MigProfile) -> int | None:
    if profile.profile_id is not None:
        return profile.profile_id
    variant = "+me" if profile.media_extensions else ""
    return GI_PROFILE_IDS.get((profile.compute_slices, profile.memory_slices, variant))


def partition_name(gpu: Gpu, profile: MigProfile, start: int) -> str:
    """The static MIG device's name for that profile and placement (NVIDIA's spelling)."""
    spelled = "".join(c for c in profile.name.lower().replace("+", "-") if c.isalnum() or c == "-")
    pid = gi_profile_id(profile)
    ident = str(pid) if pid is not None else f"p{profile.compute_slices}x{profile.memory_slices}"
    return f"gpu-{gpu.minor}-mig-{spelled}-{ident}-{start}"


def counters_json(values: Mapping[str, int]) -> Json:
    """Counters of value 0 are left out (A100's `encoders`): nothing could consume them."""
    return {name: {"value": canonical_quantity(v)} for name, v in sorted(values.items()) if v > 0}


def fits(values: Mapping[str, int], available: Mapping[str, int]) -> bool:
    """Whether a consumption fits what is left of a counter set."""
    return all(v <= available.get(name, 0) for name, v in values.items() if v > 0)


def counter_set(gpu: Gpu, geometry: MigGeometry, foreign: Iterable[MigDevice] = ()) -> Json:
    counters = available_counters(geometry, foreign)
    if len(counters) > MAX_COUNTERS_PER_SET:
        raise ValueError(
            f"GPU {gpu.uuid}: {len(counters)} counters, the API allows {MAX_COUNTERS_PER_SET}"
        )
    return {"name": counter_set_name(gpu), "counters": counters_json(counters)}


def consumption_json(gpu: Gpu, values: Mapping[str, int]) -> list[Json]:
    if len(values) > MAX_COUNTERS_PER_CONSUMPTION:
        raise ValueError(
            f"GPU {gpu.uuid}: a device consumes {len(values)} counters, the API allows "
            f"{MAX_COUNTERS_PER_CONSUMPTION}"
        )
    return [{"counterSet": counter_set_name(gpu), "counters": counters_json(values)}]


@dataclass(frozen=True, slots=True)
class DynamicGpu:
    """What one dynamic GPU publishes: its partitions, what each consumes, and its counter
    set (None when no partition is left to consume it: the API refuses an empty set)."""

    gpu: Gpu
    geometry: MigGeometry
    devices: tuple[DraDevice, ...]
    partitions: Mapping[str, Partition]
    """Device name -> partition."""
    consumption: Mapping[str, Mapping[str, int]]
    """Device name -> the counters it consumes."""
    counter_set: Json | None


def is_dynamic(gpu: Gpu, dynamic: Collection[str]) -> bool:
    """A GPU the config marks dynamic (by UUID or index) that runs in MIG mode and whose
    geometry the backend read. Without MIG mode it publishes as a whole GPU: gpuslice never
    toggles MIG mode."""
    marked = gpu.uuid in dynamic or str(gpu.index) in dynamic or "all" in dynamic
    return marked and gpu.mig_enabled and gpu.mig_geometry is not None


def dynamic_gpu(gpu: Gpu, inventory: Inventory, ours: Collection[str] = frozenset()) -> DynamicGpu:
    """The devices and counter set of `gpu` (which `is_dynamic`). `ours`: UUIDs of the MIG
    devices gpuslice created (`agent.dynamic_mig`); every other instance on the GPU is
    foreign. A partition whose instance gpuslice created carries it (`DraDevice.uuid` and
    `.mig`): health, the CDI spec and the guard then name the real MIG device, while the
    published JSON stays the same (no republish per claim)."""
    geometry = gpu.mig_geometry
    if geometry is None:
        raise ValueError(f"GPU {gpu.uuid}: no MIG geometry to publish partitions from")
    foreign = tuple(m for m in gpu.mig_devices if m.uuid not in ours)
    created: dict[str, MigDevice] = {}
    for mig in gpu.mig_devices:
        profile = geometry.profile(mig.profile)
        if mig.uuid in ours and profile is not None:
            created[partition_name(gpu, profile, mig.placement_start)] = mig
    common = common_attributes(gpu, inventory)
    devices: list[DraDevice] = []
    consumption: dict[str, Mapping[str, int]] = {}
    left = available_counters(geometry, foreign)
    parts = [p for p in partitions(gpu, geometry, foreign) if fits(p.consumes(), left)]
    for part in parts:
        attrs: dict[str, tuple[AttrKind, str | int | bool]] = {
            "type": ("string", "mig"),
            "parentUUID": ("string", gpu.uuid),
            "profile": ("string", part.profile.name),
            **common,
        }
        made = created.get(part.name)
        uuid = "" if made is None else made.uuid
        devices.append(DraDevice(part.name, "mig", uuid, gpu, made, attrs, part.capacity()))
        consumption[part.name] = part.consumes()
    return DynamicGpu(
        gpu,
        geometry,
        tuple(devices),
        {p.name: p for p in parts},
        consumption,
        counter_set(gpu, geometry, foreign) if parts else None,
    )


def with_consumption(device: Json, dyn: DynamicGpu) -> Json:
    """A published device of `dyn` (`publish.device_json`) with its `consumesCounters`."""
    values = dyn.consumption.get(str(device["name"]))
    if values is None:
        return device
    return {**device, "consumesCounters": consumption_json(dyn.gpu, values)}


def dynamic_gpus(
    inventory: Inventory, dynamic: Collection[str], ours: Collection[str] = frozenset()
) -> dict[str, DynamicGpu]:
    """GPU UUID -> what it publishes, for every GPU of `inventory` that `is_dynamic`;
    `ours` as for `dynamic_gpu` (empty: with no record of what it created, gpuslice takes
    nothing on a GPU as its own)."""
    return {
        gpu.uuid: dynamic_gpu(gpu, inventory, ours)
        for gpu in inventory.gpus
        if is_dynamic(gpu, dynamic)
    }


def counter_sets(dynamic: Mapping[str, DynamicGpu]) -> list[Json]:
    """The counter sets to publish: one per dynamic GPU with a partition left to consume
    it."""
    return [d.counter_set for d in dynamic.values() if d.counter_set is not None]


def node_devices(
    static: Sequence[DraDevice], dynamic: Mapping[str, DynamicGpu]
) -> tuple[DraDevice, ...]:
    """The node's devices in GPU order: a dynamic GPU's partitions in place of the MIG
    devices `publish.dra_devices` gave for it."""
    out: list[DraDevice] = []
    done: set[str] = set()
    for device in static:
        gpu = device.gpu.uuid
        if gpu not in dynamic:
            out.append(device)
        elif gpu not in done:
            out.extend(dynamic[gpu].devices)
            done.add(gpu)
    for uuid, dyn in dynamic.items():
        if uuid not in done:  # MIG mode with no instance: dra_devices listed nothing
            out.extend(dyn.devices)
    out.sort(key=lambda d: d.gpu.index)
    return tuple(out)


def not_offered(
    name: str, inventory: Inventory, dynamic: Collection[str], ours: Collection[str] = frozenset()
) -> str | None:
    """Why a dynamic GPU does not offer device `name` now, for Prepare's refusal of a claim
    allocated it (from slices published before the GPU changed); None when `name` is no
    such device or is offered. A claim allocated the whole GPU must not get the bare GPU in
    MIG mode, where CUDA cannot run; one whose placement someone else's instance took hears
    which instance (profile, placement, UUID) is in the way, not the node's device list."""
    for gpu in inventory.gpus:
        geometry = gpu.mig_geometry
        if not is_dynamic(gpu, dynamic) or geometry is None:
            continue
        where = f"GPU {gpu.index} ({gpu.uuid})"
        if name == f"gpu-{gpu.minor}":
            return (
                f"device {name}: {where} is in MIG mode for dynamic MIG, so the whole GPU is "
                "not offered: CUDA runs only in its MIG devices, and gpuslice never changes "
                "MIG mode. Ask for a MIG device (DeviceClass mig.nvidia.com) instead"
            )
        part = next((p for p in partitions(gpu, geometry) if p.name == name), None)
        if part is None:
            continue
        foreign = [m for m in gpu.mig_devices if m.uuid not in ours]
        why = in_the_way(part, foreign, "which gpuslice did not create for a claim")
        return None if why is None else f"device {name}: {why}"
    return None


def in_the_way(part: Partition, others: Sequence[MigDevice], whose: str) -> str | None:
    """What of `others` (instances on `part`'s GPU; `whose` says whose they are) keeps
    `part` from being created: those overlapping its placement, else those holding an engine
    or a slice count it needs more of than is left; None when nothing does. Named by
    profile, placement, GPU instance ID and UUID, as `nvidia-smi mig -lgi` shows them."""
    span = (
        f"{part.profile.name} at memory slices {part.start}..{part.slots[-1]} of GPU "
        f"{part.gpu.index} ({part.gpu.uuid})"
    )
    overlapping = [m for m in others if set(part.slots) & set(_held(m))]
    if overlapping:
        return f"{span} is taken by {_instances(overlapping, whose)}"
    geometry = part.gpu.mig_geometry
    if geometry is None:
        return None
    left = available_counters(geometry, others)
    short = sorted(c for c, v in part.consumes().items() if v > left.get(c, 0))
    if not short:
        return None
    holders = [m for m in others if any(foreign_consumption(geometry, [m]).get(c) for c in short)]
    return f"{span} needs {', '.join(short)} held by {_instances(holders, whose)}"


def _held(mig: MigDevice) -> range:
    return range(max(mig.placement_start, 0), mig.placement_start + mig.placement_size)


def _instances(migs: Sequence[MigDevice], whose: str) -> str:
    named = [
        f"{m.profile} at placement {m.placement_start}:{m.placement_size} "
        f"(GPU instance {m.gi_id}, {m.uuid})"
        for m in migs
    ]
    if len(named) > 1:
        return f"MIG devices {'; '.join(named)}, {whose}; they are left alone"
    return f"MIG device {''.join(named) or 'on the GPU'}, {whose}; it is left alone"


WOULD_BE_UUID = "MIG-created-at-prepare"
"""How the UUIDs `describe --claims` shows for MIG devices Prepare would create begin (the
real one is the driver's to give): `MIG-created-at-prepare-gpu<index>-<start>`."""


def would_be(part: Partition, held: Sequence[MigDevice]) -> MigDevice:
    """The MIG device Prepare would create for `part` next to the instances `held` on its
    GPU, for `describe --claims`: GPU instance ID the lowest free one (the driver chooses
    the real one), capability minors in the driver's fixed numbering."""
    p, gpu = part.profile, part.gpu
    gi_id = min(set(range(1, 16)) - {m.gi_id for m in held}, default=15)
    return p.device(
        uuid=f"{WOULD_BE_UUID}-gpu{gpu.index}-{part.start}",
        parent_uuid=gpu.uuid,
        parent_index=gpu.index,
        parent_minor=gpu.minor,
        index=len(held),
        gi_id=gi_id,
        ci_id=0,
        start=part.start,
    )
