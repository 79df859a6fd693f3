"""Node labels as GPU Feature Discovery (GFD) writes them, computed from inventory + plan.

Schedulers, node selectors and the NVIDIA MPS daemon's node selector already key on these
exact names and values (`nvidia.com/gpu.product=Tesla-T4-SHARED`, `nvidia.com/mps.capable`),
so existing manifests keep working only if the labels match GFD's, quirks included.

Rules that are ours, where GFD has no equivalent (per-GPU sharing lets one resource mix
replica counts, and several advertised resources may share one original name):

* resources are grouped by their ORIGINAL name (`label_name`), as GFD keys labels by it;
* a group's `replicas` is the MAXIMUM replica count over its devices (what the most shared
  GPU offers), and `-SHARED` is appended when that maximum is above 1 and the resource
  carrying it is not renamed;
* `sharing-strategy` is the plan's strategy of that resource (so MPS with one replica, which
  gpuslice allows, reads `mps`), `none` when nothing in the group is shared;
* `count` is the number of physical devices of the labelled model in the group;
* every value is made a valid label value (at most 63 characters, alphanumeric at both
  ends): the API server refuses a whole apply for one bad value, and a DMI machine name
  such as Lenovo's `ThinkSystem SR670 V2 -[7Z22CTO1WW]-` sanitises to one ending in `-`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.core.devices import PCI_CLASS_3D, PCI_CLASS_VGA, Gpu, Inventory, MigDevice
from gpuslice.core.sharing.miglayout import single_layout_problem
from gpuslice.core.sharing.model import Plan, ResourcePlan, SharingStrategy

PREFIX = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"

_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")
_SPACES = re.compile(r"\s+")
_MIG_ONLY = ("multiprocessors", "slices.", "engines.")
_EDGES = "-_."
LABEL_VALUE_MAX = 63


def sanitise(value: str) -> str:
    """GFD's label-value cleaning: drop characters outside `[A-Za-z0-9-_. ]`, then turn each
    whitespace run into one `-` (`Tesla T4` -> `Tesla-T4`)."""
    return _SPACES.sub("-", _UNSAFE.sub("", value).strip())


def label_value(value: str) -> str:
    """`value` as a valid Kubernetes label value: cut to 63 characters and trimmed of the
    `-`, `_` and `.` a valid value may not begin or end with (unchanged when valid)."""
    return value[:LABEL_VALUE_MAX].strip(_EDGES)


def gpu_family(compute_capability: tuple[int, int]) -> str:
    """Architecture name from the CUDA compute capability, as GFD maps it."""
    major, minor = compute_capability
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    if major in families:
        return families[major]
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ada-lovelace" if minor == 9 else "ampere"
    if major in (10, 12):
        return "blackwell"
    if major == 13:
        return "rubin"
    return "undefined"


def gpu_mode(gpus: Sequence[Gpu]) -> str:
    """GFD's `gpu.mode` from the PCI class: `graphics` for VGA controllers, `compute` for 3D
    controllers, `unknown` for anything else or when the GPUs disagree
    (`internal/lm/nvml.go`, TestGPUModeLabeler)."""
    classes = {g.pci_class for g in gpus}
    if len(classes) != 1:
        return "unknown"
    modes: dict[int | None, str] = {PCI_CLASS_VGA: "graphics", PCI_CLASS_3D: "compute"}
    return modes.get(classes.pop(), "unknown")


def mig_profile_label(profile: str) -> str:
    """`1g.10gb+me` -> `1g.10gb.me`: the form NVIDIA uses in resource and label names."""
    return profile.replace("+", ".")


def gfd_labels(
    inventory: Inventory, plan: Plan, *, timestamp: int | None, machine_type: str
) -> dict[str, str]:
    """Every label GFD would write for this node. Empty when the node has no GPU (GFD
    writes nothing GPU-specific then, and a stale `gpu.product` would attract pods)."""
    if not inventory.gpus:
        return {}
    labels: dict[str, str] = {}
    if timestamp is not None:
        labels[PREFIX + "gfd.timestamp"] = str(timestamp)
    labels[PREFIX + "gpu.machine"] = label_value(sanitise(machine_type)) or "unknown"
    labels.update(_driver_labels(inventory))
    labels[PREFIX + "mig.capable"] = _bool(any(g.mig_capable for g in inventory.gpus))
    uses_mps = any(r.strategy == SharingStrategy.MPS for r in plan.resources)
    any_mig = any(g.mig_enabled for g in inventory.gpus)
    labels[PREFIX + "mps.capable"] = _bool(uses_mps and not any_mig)
    labels[PREFIX + "gpu.mode"] = gpu_mode(inventory.gpus)
    if plan.mig_strategy != "none":
        labels[PREFIX + "mig.strategy"] = plan.mig_strategy
    labels.update(_resource_labels(inventory, plan))
    if plan.mig_strategy == "single" and single_layout_problem(inventory.gpus) is not None:
        for key in [k for k in labels if k.startswith(GPU_RESOURCE + ".")]:
            if key.removeprefix(GPU_RESOURCE + ".").startswith(_MIG_ONLY):
                del labels[key]
        labels.update(_invalid_single(inventory))
    return {key: label_value(value) for key, value in labels.items()}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _driver_labels(inventory: Inventory) -> dict[str, str]:
    out: dict[str, str] = {}
    parts = inventory.driver_version.split(".")
    if len(parts) in (2, 3) and all(p.isdigit() for p in parts):
        major, minor = parts[0], parts[1]
        rev = parts[2] if len(parts) == 3 else ""
        out |= {
            PREFIX + "cuda.driver.major": major,
            PREFIX + "cuda.driver.minor": minor,
            PREFIX + "cuda.driver.rev": rev,
            PREFIX + "cuda.driver-version.major": major,
            PREFIX + "cuda.driver-version.minor": minor,
            PREFIX + "cuda.driver-version.revision": rev,
            PREFIX + "cuda.driver-version.full": inventory.driver_version,
        }
    cuda = inventory.cuda_driver_version
    if cuda > 0:
        major_i, minor_i = cuda // 1000, (cuda % 1000) // 10
        out |= {
            PREFIX + "cuda.runtime.major": str(major_i),
            PREFIX + "cuda.runtime.minor": str(minor_i),
            PREFIX + "cuda.runtime-version.major": str(major_i),
            PREFIX + "cuda.runtime-version.minor": str(minor_i),
            PREFIX + "cuda.runtime-version.full": f"{major_i}.{minor_i}",
        }
    return out


@dataclass(frozen=True, slots=True)
class _Sharing:
    replicas: int
    strategy: SharingStrategy
    shared_suffix: bool


def _sharing(group: Sequence[ResourcePlan]) -> _Sharing:
    """The group's sharing as one label set: the maximum replicas (see module docstring)."""
    best: ResourcePlan | None = None
    best_replicas = 0
    for res in group:
        replicas = max((d.replicas for d in res.devices), default=0)
        if replicas > best_replicas:
            best, best_replicas = res, replicas
    if best is None:
        return _Sharing(replicas=0, strategy=SharingStrategy.NONE, shared_suffix=False)
    strategy: SharingStrategy = best.strategy
    if best_replicas <= 1 and strategy == SharingStrategy.TIME_SLICING:
        strategy = SharingStrategy.NONE  # one time slice is the whole GPU: nothing is shared
    return _Sharing(
        replicas=best_replicas,
        strategy=strategy,
        shared_suffix=best_replicas > 1 and not best.renamed,
    )


def _groups(plan: Plan) -> dict[str, list[ResourcePlan]]:
    groups: dict[str, list[ResourcePlan]] = {}
    for res in plan.resources:
        groups.setdefault(res.label_name, []).append(res)
    return groups


def _resource_labels(inventory: Inventory, plan: Plan) -> dict[str, str]:
    out: dict[str, str] = {}
    groups = _groups(plan)
    for label_name, group in groups.items():
        physical = [d.physical for r in group for d in r.devices]
        mig_uuids = [p.uuid for p in physical if p.kind == "mig"]
        gpu_uuids = [p.uuid for p in physical if p.kind == "gpu"]
        sharing = _sharing(group)
        if gpu_uuids:
            gpus = [g for g in inventory.gpus if g.uuid in set(gpu_uuids)]
            if all(g.mig_enabled for g in gpus):
                # GFD labels a MIG-enabled GPU without sharing (replicas 0, strategy none, no
                # -SHARED): its replicas cannot run CUDA while MIG is on
                # (`internal/lm/mig-strategy.go`, TestMigStrategyNoneLabels).
                sharing = _Sharing(replicas=0, strategy=SharingStrategy.NONE, shared_suffix=False)
            also: list[Gpu] = []
            if label_name == GPU_RESOURCE:
                # GFD counts GPUs by product over MIG-enabled and whole GPUs alike, so under
                # `mixed` a MIG A100 next to a whole A100 gives count 2.
                also = [g for g in inventory.gpus if g.mig_enabled and g not in gpus]
            out |= _full_gpu_labels(label_name, gpus, sharing, also)
        elif mig_uuids:
            wanted = set(mig_uuids)
            migs = [m for m in inventory.mig_devices() if m.uuid in wanted]
            if migs:
                out |= _mig_labels(label_name, inventory, migs, sharing)
                if plan.mig_strategy == "single":
                    parent = inventory.gpu_by_uuid(migs[0].parent_uuid)
                    if parent is not None:
                        out |= _compute_labels(label_name, parent)
    if GPU_RESOURCE not in groups:
        # GFD still describes the physical GPUs when none is advertised whole (every GPU
        # in MIG mode under `mixed`): replicas 0 says "not schedulable as nvidia.com/gpu".
        unshared = _Sharing(replicas=0, strategy=SharingStrategy.NONE, shared_suffix=False)
        out |= _full_gpu_labels(GPU_RESOURCE, list(inventory.gpus), unshared)
    return out


def _full_gpu_labels(
    name: str, gpus: Sequence[Gpu], sharing: _Sharing, also_counted: Sequence[Gpu] = ()
) -> dict[str, str]:
    ordered = sorted(gpus, key=lambda g: g.index)
    first = ordered[0]
    product = sanitise(first.product_name)
    count = sum(1 for g in [*ordered, *also_counted] if g.product_name == first.product_name)
    if sharing.shared_suffix:
        product += "-SHARED"
    labels = {
        f"{name}.count": str(count),
        f"{name}.product": product,
        f"{name}.replicas": str(sharing.replicas),
        f"{name}.sharing-strategy": sharing.strategy.label_value,
    }
    if first.memory_reported:
        # GFD writes no memory label where NVML reports no memory (a unified-memory GPU).
        labels[f"{name}.memory"] = str(first.memory_mib)
    return labels | _compute_labels(name, first)


def _compute_labels(name: str, gpu: Gpu) -> dict[str, str]:
    return {
        f"{name}.family": gpu_family(gpu.compute_capability),
        f"{name}.compute.major": str(gpu.compute_capability[0]),
        f"{name}.compute.minor": str(gpu.compute_capability[1]),
    }


def _mig_labels(
    name: str, inventory: Inventory, migs: Sequence[MigDevice], sharing: _Sharing
) -> dict[str, str]:
    first = min(migs, key=lambda m: (m.parent_index, m.index))
    parent = inventory.gpu_by_uuid(first.parent_uuid)
    model = sanitise(parent.product_name) if parent is not None else "unknown"
    product = f"{model}-MIG-{sanitise(mig_profile_label(first.profile))}"
    if sharing.shared_suffix:
        product += "-SHARED"
    return {
        f"{name}.count": str(len(migs)),
        f"{name}.product": product,
        f"{name}.replicas": str(sharing.replicas),
        f"{name}.sharing-strategy": sharing.strategy.label_value,
        f"{name}.memory": str(first.memory_mib),
        f"{name}.multiprocessors": str(first.multiprocessors),
        f"{name}.slices.gi": str(first.slices_gi),
        f"{name}.slices.ci": str(first.slices_ci),
        f"{name}.engines.copy": str(first.engines_copy),
        f"{name}.engines.decoder": str(first.engines_decoder),
        f"{name}.engines.encoder": str(first.engines_encoder),
        f"{name}.engines.jpeg": str(first.engines_jpeg),
        f"{name}.engines.ofa": str(first.engines_ofa),
    }


def _invalid_single(inventory: Inventory) -> dict[str, str]:
    model = sanitise(min(inventory.gpus, key=lambda g: g.index).product_name)
    name = GPU_RESOURCE
    return {
        f"{name}.product": f"{model}-MIG-INVALID",
        f"{name}.count": "0",
        f"{name}.replicas": "0",
        f"{name}.sharing-strategy": "",
        f"{name}.memory": "0",
    }
