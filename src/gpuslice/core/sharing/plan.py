"""From the node's GPUs and a config to what the node advertises: `build_plan`.

Three steps, each a pure function: physical units per MIG strategy (whole GPUs or MIG
devices), a base resource name per unit from the `resources` patterns, then the sharing
entries turn selected units into replicas (and move them to a new name when renamed).
Everything NVIDIA would refuse at start-up is a `PlanError` here, with NVIDIA's wording and
what to change, so a bad config is rejected before anything is advertised. One exception: a
MIG layout `single` cannot serve is the node's state, not the config's fault, and fixing it
needs no config change; the plan then advertises nothing and carries the reason in
`mig_layout_problem` (NVIDIA's plugin crash-loops there instead).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuslice.core.config import (
    Config,
    DeviceSelection,
    ReplicatedResource,
    ReplicatedResources,
    allocate_settings,
)
from gpuslice.core.config.fields import SHARED_SUFFIX
from gpuslice.core.devices import Gpu, Inventory
from gpuslice.core.errors import PlanError
from gpuslice.core.sharing.miglayout import single_layout_problem
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    HostFacts,
    MigStrategy,
    MpsShare,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
    replica_id,
)

DEFAULT_GPU_RESOURCE = ResourceName("nvidia.com/gpu")
MPS_MAX_REPLICAS = 48
"""Most MPS clients per GPU from compute capability 7.5 (NVIDIA's MPS daemon check)."""
MPS_MAX_REPLICAS_PRE_TURING = 16
MPS_FULL_LIMIT_CAPABILITY = (7, 5)

_COMPUTE_SLICED_PROFILE = re.compile(r"^\d+c\.")
"""`1c.3g.20gb`: a compute instance smaller than its GPU instance. NVIDIA's mixed-strategy
defaults name only profiles whose C equals G, so these need a user pattern."""


@dataclass(frozen=True, slots=True)
class _Unit:
    """A physical device with the base resource it belongs to."""

    physical: PhysicalDevice
    gpu: Gpu
    base: ResourceName
    mig_index: int
    """Position under the parent GPU (-1 for a whole GPU): with gpu_index, the sort order."""

    @property
    def order(self) -> tuple[int, int]:
        return (self.physical.gpu_index, self.mig_index)

    def answers_to(self, ref: str) -> bool:
        """Whether a `devices` entry names this unit (index, UUID, or `MIG-GPU-.../gi/ci`)."""
        p = self.physical
        if ref in (p.index_id, p.uuid):
            return True
        return p.kind == "mig" and ref == f"MIG-{p.gpu_uuid}/{p.gi_id}/{p.ci_id}"


@dataclass(slots=True)
class _Resource:
    """An advertised resource while it is being assembled."""

    label_name: ResourceName
    strategy: SharingStrategy = SharingStrategy.NONE
    """Entries for one base resource all come from one sharing block (the schema forbids a
    name in both), and two bases never merge, so a resource has at most one strategy."""
    fail_requests_greater_than_one: bool = False
    devices: list[tuple[tuple[int, int, int], AdvertisedDevice]] = field(default_factory=list)


def _glob(pattern: str) -> re.Pattern[str]:
    """NVIDIA's resource patterns: `*` matches any run of characters, anchored (v0.20+)."""
    return re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$")


def _mig_resource_name(profile: str) -> ResourceName:
    return ResourceName(f"nvidia.com/mig-{profile.replace('+', '.')}")


def _mig_patterns(
    config: Config, strategy: MigStrategy, profiles: Iterable[str]
) -> list[tuple[str, ResourceName]]:
    if config.resources.mig:
        return [(p.pattern, ResourceName(p.name)) for p in config.resources.mig]
    if strategy == "single":
        return [("*", DEFAULT_GPU_RESOURCE)]
    return [
        (p, _mig_resource_name(p))
        for p in sorted(set(profiles))
        if not _COMPUTE_SLICED_PROFILE.match(p)
    ]


def _name_for(
    value: str, patterns: Sequence[tuple[str, ResourceName]], what: str, key: str
) -> ResourceName:
    for pattern, name in patterns:
        if _glob(pattern).match(value):
            return name
    listed = ", ".join(f"'{p}'" for p, _ in patterns) or "none"
    raise PlanError(
        f"{what} '{value}' does not match any resource patterns (resources.{key}: {listed}); "
        f"add a pattern that matches it to resources.{key}, or remove resources.{key} to use "
        "the built-in names"
    )


def _units(
    inventory: Inventory, config: Config, warnings: list[str], strategy_warnings: list[str]
) -> list[_Unit]:
    """`strategy_warnings` gets the warnings about `migStrategy` itself (also in `warnings`)."""
    strategy = config.flags.mig_strategy
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    gpu_patterns = [(p.pattern, ResourceName(p.name)) for p in config.resources.gpus] or [
        ("*", DEFAULT_GPU_RESOURCE)
    ]
    if strategy == "none":
        use_mig = dict.fromkeys((g.index for g in gpus), False)
        for g in gpus:
            if g.mig_enabled:
                strategy_warnings.append(
                    f"GPU {g.index} has MIG enabled but migStrategy is 'none': it is "
                    "advertised as a whole GPU, which containers cannot use while MIG is on"
                )
                warnings.append(strategy_warnings[-1])
    elif strategy == "single":
        problem = single_layout_problem(gpus)
        if problem is not None:
            # NVIDIA's plugin exits here and crash-loops until someone repartitions; gpuslice
            # stays up, advertises nothing for the layout, and the labels say MIG-INVALID.
            strategy_warnings.append(
                f"invalid MIG configuration for migStrategy 'single': {problem}"
            )
            warnings.append(strategy_warnings[-1])
            return []
        mig_node = any(g.mig_enabled for g in gpus)
        use_mig = dict.fromkeys((g.index for g in gpus), mig_node)
    else:
        use_mig = {g.index: g.mig_enabled for g in gpus}
    profiles = (m.profile for g in gpus if use_mig[g.index] for m in g.mig_devices)
    mig_patterns = _mig_patterns(config, strategy, profiles)
    units: list[_Unit] = []
    for g in gpus:
        if g.mig_pending != g.mig_enabled:
            warnings.append(
                f"GPU {g.index} has a pending MIG mode change (now "
                f"{'enabled' if g.mig_enabled else 'disabled'}): it applies after a GPU reset"
            )
        dynamic = config.flags.dynamic_mig
        marked = dynamic is not None and bool(
            {"all", g.uuid, str(g.index)} & set(dynamic.markers())
        )
        named = dynamic is not None and bool({g.uuid, str(g.index)} & set(dynamic.markers()))
        if marked and not g.mig_enabled and (g.mig_capable or named):
            why = "is not in MIG mode" if g.mig_capable else "does not support MIG"
            warnings.append(
                f"GPU {g.index} is marked for dynamic MIG (flags.dynamicMig) but {why}: it is "
                "published as a whole GPU (gpuslice never changes MIG mode)"
            )
        if not use_mig[g.index]:
            name = _name_for(g.product_name, gpu_patterns, "GPU name", "gpus")
            units.append(_Unit(PhysicalDevice.of_gpu(g), g, name, -1))
            continue
        if not g.mig_devices and not marked:  # a dynamic GPU's are made per claim (DRA)
            warnings.append(
                f"GPU {g.index} has MIG enabled but no MIG devices: it advertises nothing"
            )
        for m in sorted(g.mig_devices, key=lambda m: m.index):
            name = _name_for(m.profile, mig_patterns, "MIG profile", "mig")
            units.append(_Unit(PhysicalDevice.of_mig(g, m), g, name, m.index))
    return units


def _select(devices: DeviceSelection, units: Sequence[_Unit], name: str, where: str) -> list[_Unit]:
    have = ", ".join(u.physical.index_id for u in units)
    if devices == "all":
        return list(units)
    if isinstance(devices, int):
        if devices > len(units):
            raise PlanError(
                f"{where}.devices: {devices} devices requested but this node has only "
                f"{len(units)} {name} device(s) ({have}); lower the count or use 'all'"
            )
        return list(units[:devices])
    selected: list[_Unit] = []
    for ref in devices:
        matches = [u for u in units if u.answers_to(ref)]
        if not matches:
            raise PlanError(
                f"{where}.devices: device '{ref}' is not a {name} device on this node "
                f"({name} devices here: {have}); fix the index or UUID"
            )
        selected.extend(u for u in matches if u not in selected)
    return selected


def _mps_limit(gpu: Gpu) -> int:
    if gpu.compute_capability >= MPS_FULL_LIMIT_CAPABILITY:
        return MPS_MAX_REPLICAS
    return MPS_MAX_REPLICAS_PRE_TURING


def _check_mps(unit: _Unit, replicas: int, where: str, name: str) -> None:
    if unit.physical.kind == "mig":
        raise PlanError(
            f"{where}: sharing using MPS is not supported for MIG devices ({name} is MIG "
            f"device {unit.physical.index_id}); share MIG devices with time-slicing, or use "
            "MPS on whole GPUs (migStrategy 'none')"
        )
    if unit.gpu.mig_enabled:
        raise PlanError(
            f"{where}: MPS sharing is not supported for mig devices: GPU {unit.gpu.index} "
            f"'{unit.gpu.product_name}' has MIG mode enabled, so CUDA (and an MPS server) "
            "cannot run on the whole GPU; disable MIG on it (nvidia-smi -i "
            f"{unit.gpu.index} -mig 0) or share its MIG devices with time-slicing"
        )
    limit = _mps_limit(unit.gpu)
    if replicas > limit:
        major, minor = unit.gpu.compute_capability
        raise PlanError(
            f"{where}.replicas: invalid device maximum allowed replicas exceeded: "
            f"{replicas} > {limit} (GPU {unit.gpu.index} '{unit.gpu.product_name}', compute "
            f"capability {major}.{minor}: MPS serves at most {MPS_MAX_REPLICAS} clients per GPU "
            f"from compute capability 7.5 and {MPS_MAX_REPLICAS_PRE_TURING} below); lower replicas"
        )


@dataclass(frozen=True, slots=True)
class _Assignment:
    entry: ReplicatedResource
    block: ReplicatedResources
    strategy: SharingStrategy
    where: str


def _assignments(
    config: Config, by_base: dict[ResourceName, list[_Unit]], warnings: list[str]
) -> dict[str, _Assignment]:
    """Physical UUID -> the sharing entry that selected it."""
    blocks: list[tuple[str, SharingStrategy, ReplicatedResources | None]] = [
        ("timeSlicing", SharingStrategy.TIME_SLICING, config.sharing.time_slicing),
        ("mps", SharingStrategy.MPS, config.sharing.mps),
    ]
    chosen: dict[str, _Assignment] = {}
    for key, strategy, block in blocks:
        if block is None:
            continue
        for i, entry in enumerate(block.resources):
            where = f"sharing.{key}.resources[{i}]"
            units = by_base.get(ResourceName(entry.name), [])
            if not units:
                warnings.append(
                    f"{where}: no device on this node is advertised as {entry.name}; "
                    "the entry has no effect here"
                )
                continue
            for unit in _select(entry.devices, units, entry.name, where):
                earlier = chosen.get(unit.physical.uuid)
                if earlier is not None:
                    raise PlanError(
                        f"{where}.devices: device {unit.physical.index_id} "
                        f"({unit.physical.uuid}) is also selected by {earlier.where}; entries "
                        "for one resource must select disjoint devices"
                    )
                if strategy is SharingStrategy.MPS and entry.replicas > 1:
                    _check_mps(unit, entry.replicas, where, entry.name)
                chosen[unit.physical.uuid] = _Assignment(entry, block, strategy, where)
    return chosen


def _advertise(
    resources: dict[ResourceName, _Resource],
    name: ResourceName,
    unit: _Unit,
    devices: list[AdvertisedDevice],
    strategy: SharingStrategy | None,
    fail_multi: bool,
) -> None:
    res = resources.get(name)
    if res is None:
        res = resources[name] = _Resource(label_name=unit.base)
    elif res.label_name != unit.base:
        raise PlanError(
            f"resource {name} would hold both {res.label_name} and {unit.base} devices; "
            "give the renamed resource a name of its own"
        )
    if strategy is not None:
        res.strategy = strategy
        res.fail_requests_greater_than_one = res.fail_requests_greater_than_one or fail_multi
    gpu_index, mig_index = unit.order
    res.devices.extend(((gpu_index, mig_index, d.replica or 0), d) for d in devices)


def build_plan(inventory: Inventory, config: Config, host: HostFacts | None = None) -> Plan:
    """What this node advertises with this config. Raises PlanError if it cannot apply.

    `host` (the IMEX channels found, the agent's soft-limits flag) makes it the plan the
    daemon serves; without it, the plan of the config alone (what NVIDIA's plugin would
    answer, and what the core's tests compare with)."""
    warnings: list[str] = []
    strategy_warnings: list[str] = []
    units = _units(inventory, config, warnings, strategy_warnings)
    by_base: dict[ResourceName, list[_Unit]] = {}
    for unit in units:
        by_base.setdefault(unit.base, []).append(unit)
    chosen = _assignments(config, by_base, warnings)

    resources: dict[ResourceName, _Resource] = {}
    for unit in units:
        pick = chosen.get(unit.physical.uuid)
        if pick is None or pick.entry.replicas == 1:
            rename = pick.entry.rename if pick is not None else None
            name = ResourceName(rename) if rename else unit.base
            exclusive = AdvertisedDevice(
                id=DeviceId(unit.physical.uuid),
                physical=unit.physical,
                replica=None,
                replicas=1,
            )
            _advertise(resources, name, unit, [exclusive], None, False)
            continue
        entry, block = pick.entry, pick.block
        if entry.rename:
            name = ResourceName(entry.rename)
        elif block.rename_by_default:
            name = ResourceName(unit.base + SHARED_SUFFIX)
        else:
            name = unit.base
        share = None
        if pick.strategy is SharingStrategy.MPS:
            share = MpsShare.even(unit.physical, entry.replicas)
        replicas = [
            AdvertisedDevice(
                id=replica_id(unit.physical.uuid, n),
                physical=unit.physical,
                replica=n,
                replicas=entry.replicas,
                mps=share,
            )
            for n in range(entry.replicas)
        ]
        _advertise(
            resources, name, unit, replicas, pick.strategy, block.fail_requests_greater_than_one
        )

    plans = []
    for name in sorted(resources):
        res = resources[name]
        plans.append(
            ResourcePlan(
                name=name,
                label_name=res.label_name,
                strategy=res.strategy,
                fail_requests_greater_than_one=res.fail_requests_greater_than_one,
                devices=tuple(d for _, d in sorted(res.devices, key=lambda item: item[0])),
            )
        )
    layout_problem = None
    if config.flags.mig_strategy == "single":
        layout_problem = single_layout_problem(sorted(inventory.gpus, key=lambda g: g.index))
    return Plan(
        resources=tuple(plans),
        allocate=allocate_settings(config, host),
        mig_strategy=config.flags.mig_strategy,
        warnings=tuple(warnings),
        mig_strategy_warnings=tuple(strategy_warnings),
        mig_layout_problem=layout_problem,
        dynamic_mig=() if config.flags.dynamic_mig is None else config.flags.dynamic_mig.markers(),
    )
