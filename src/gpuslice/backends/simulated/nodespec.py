"""What a simulated node holds: parsed from a spec string or a YAML node file.

Spec strings (`--node` / `GPUSLICE_NODE`) cover the common cases in one line::

    sim:2xt4                               two Tesla T4
    sim:1xt4,1xl40s                        groups joined by ','
    sim:8xa100-40gb                        an HGX A100 board (NVLink between all pairs)
    sim:1xa100-80gb/mig=1g.10gb*7          MIG layout per group: PROFILE*COUNT joined by '+'
    sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2
    sim:2xh100-80gb/mig=all-1g.10gb        mig-parted style: as many as fit
    sim:1xa30/mig=                         MIG mode on, no instances yet

YAML node files describe richer nodes (`sim:/path/node.yaml` or just the path)::

    driverVersion: "550.54.15"          # optional
    cudaDriverVersion: 12040            # optional, NVML's integer form
    machineType: "DGX A100"             # optional, for the gpu.machine label
    controlDir: ./control               # optional, relative to this file: see `control`
    gpus:
      - model: a100-40gb                # required, one of the models in `models`
        count: 2                        # optional, default 1
        mig: "3g.20gb*2"                # optional layout; turns MIG mode on
        migEnabled: true                # optional; default: true when `mig` is given
        migPending: true                # optional; default: same as the current mode
        numa: 1                         # optional NUMA node for the group
        uuid: GPU-...                   # optional, only with count 1
        healthEvents: unmonitored       # optional: watched (default); unmonitored (NVML
                                        # refuses to register its health events);
                                        # unsupported (NVML: too old for them)
      - model: t4
    processes:                          # optional: GPU processes present from the start
      - pid: 4242
        gpu: 0                          # GPU index or UUID
        mig: 1                          # optional: MIG device index under it, or its UUID
        usedMemoryMiB: 1024             # optional (absent: NVML could not tell)
        smUtil: 35                      # optional
        mps: true                       # optional: an MPS client
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import yaml

from gpuslice.backends.simulated.models import MODELS, GpuModel, known_models
from gpuslice.ports import BackendError

DEFAULT_DRIVER = "550.54.15"
DEFAULT_CUDA = 12040
MAX_GPUS = 32

HealthWatch = Literal["watched", "unmonitored", "unsupported"]
_HEALTH_WATCH: tuple[HealthWatch, ...] = get_args(HealthWatch)

_GROUP = re.compile(r"^(?:(?P<count>\d+)x)?(?P<model>[a-z0-9-]+)(?:/mig=(?P<mig>.*))?$")


@dataclass(frozen=True, slots=True)
class GpuGroup:
    model: GpuModel
    count: int = 1
    mig_layout: str | None = None
    mig_enabled: bool = False
    mig_pending: bool | None = None
    numa: int | None = None
    uuid: str | None = None
    health_events: HealthWatch = "watched"
    """Whether NVML would register the group's health events (`HealthEvent` kinds
    `unmonitored`, `unsupported`): the backend reports the GPUs it could not watch."""


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    pid: int
    gpu: int | str
    mig: int | str | None = None
    used_memory_mib: int | None = None
    sm_util_percent: int | None = None
    mps: bool = False


@dataclass(frozen=True, slots=True)
class NodeSpec:
    groups: tuple[GpuGroup, ...]
    driver_version: str = DEFAULT_DRIVER
    cuda_driver_version: int = DEFAULT_CUDA
    machine_type: str = "simulated"
    control_dir: Path | None = None
    processes: tuple[ProcessSpec, ...] = ()
    source: str = ""
    """The spec or file it came from, for messages."""


def parse_spec(text: str) -> NodeSpec:
    """`COUNTxMODEL[/mig=LAYOUT][,...]`, without the `sim:` prefix."""
    groups: list[GpuGroup] = []
    for part in text.split(","):
        part = part.strip()
        m = _GROUP.match(part.lower())
        if m is None:
            raise BackendError(
                f"simulated node spec {text!r}: cannot read {part!r}; write "
                f"COUNTxMODEL[/mig=LAYOUT] joined by ',', e.g. sim:2xt4 or "
                f"sim:1xa100-80gb/mig=1g.10gb*7 (models: {known_models()})"
            )
        count = int(m.group("count") or "1")
        mig = m.group("mig")
        groups.append(
            GpuGroup(
                model=_model(m.group("model"), f"spec {text!r}"),
                count=_positive(count, f"spec {text!r}: count"),
                mig_layout=mig,
                mig_enabled=mig is not None,
            )
        )
    spec = NodeSpec(groups=tuple(groups), source=f"sim:{text}")
    _check_size(spec)
    return spec


def load_node_file(path: Path) -> NodeSpec:
    where = str(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackendError(f"simulated node file {where} not found") from None
    except (OSError, yaml.YAMLError) as exc:
        raise BackendError(f"simulated node file {where}: cannot read it: {exc}") from None
    if not isinstance(raw, Mapping):
        raise BackendError(f"simulated node file {where}: expected a mapping with a `gpus` list")
    _no_unknown(
        raw,
        {"driverVersion", "cudaDriverVersion", "machineType", "controlDir", "gpus", "processes"},
        where,
    )
    gpus = raw.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise BackendError(f"{where}: gpus: expected a non-empty list of {{model, count, mig}}")
    groups = tuple(_group(item, f"{where}: gpus[{i}]") for i, item in enumerate(gpus))
    procs_raw = raw.get("processes", [])
    if not isinstance(procs_raw, list):
        raise BackendError(f"{where}: processes: expected a list")
    processes = tuple(_process(p, f"{where}: processes[{i}]") for i, p in enumerate(procs_raw))
    control = raw.get("controlDir")
    control_dir: Path | None = None
    if control is not None:
        if not isinstance(control, str) or not control:
            raise BackendError(f"{where}: controlDir: expected a directory path")
        control_dir = path.parent / control
    spec = NodeSpec(
        groups=groups,
        driver_version=_str(raw.get("driverVersion", DEFAULT_DRIVER), f"{where}: driverVersion"),
        cuda_driver_version=_int(
            raw.get("cudaDriverVersion", DEFAULT_CUDA), f"{where}: cudaDriverVersion"
        ),
        machine_type=_str(raw.get("machineType", "simulated"), f"{where}: machineType"),
        control_dir=control_dir,
        processes=processes,
        source=where,
    )
    _check_size(spec)
    return spec


def _group(item: object, where: str) -> GpuGroup:
    if not isinstance(item, Mapping):
        raise BackendError(f"{where}: expected a mapping like {{model: t4, count: 2}}")
    _no_unknown(
        item,
        {"model", "count", "mig", "migEnabled", "migPending", "numa", "uuid", "healthEvents"},
        where,
    )
    if "model" not in item:
        raise BackendError(f"{where}.model: required; one of {known_models()}")
    model = _model(_str(item["model"], f"{where}.model"), where)
    count = _positive(_int(item.get("count", 1), f"{where}.count"), f"{where}.count")
    mig = item.get("mig")
    if mig is not None:
        mig = _str(mig, f"{where}.mig")
    enabled = item.get("migEnabled", mig is not None)
    if not isinstance(enabled, bool):
        raise BackendError(f"{where}.migEnabled: expected true or false, got {enabled!r}")
    pending = item.get("migPending")
    if pending is not None and not isinstance(pending, bool):
        raise BackendError(f"{where}.migPending: expected true or false, got {pending!r}")
    if (enabled or pending) and model.mig is None:
        raise BackendError(f"{where}: {model.key} ({model.product_name}) does not support MIG")
    if mig and not enabled:
        raise BackendError(f"{where}: a mig layout needs migEnabled: true")
    numa = item.get("numa")
    if numa is not None:
        numa = _int(numa, f"{where}.numa")
    uuid = item.get("uuid")
    if uuid is not None:
        uuid = _str(uuid, f"{where}.uuid")
        if count != 1:
            raise BackendError(f"{where}.uuid: only allowed with count 1 (count is {count})")
        if not uuid.startswith("GPU-"):
            raise BackendError(f"{where}.uuid: expected GPU-xxxxxxxx-..., got {uuid!r}")
    watch = next((w for w in _HEALTH_WATCH if w == item.get("healthEvents", "watched")), None)
    if watch is None:
        raise BackendError(
            f"{where}.healthEvents: expected one of {', '.join(_HEALTH_WATCH)}, "
            f"got {item.get('healthEvents')!r}"
        )
    return GpuGroup(
        model=model,
        count=count,
        mig_layout=mig if enabled else None,
        mig_enabled=enabled,
        mig_pending=pending,
        numa=numa,
        uuid=uuid,
        health_events=watch,
    )


def _process(item: object, where: str) -> ProcessSpec:
    if not isinstance(item, Mapping):
        raise BackendError(f"{where}: expected a mapping like {{pid: 42, gpu: 0}}")
    _no_unknown(item, {"pid", "gpu", "mig", "usedMemoryMiB", "smUtil", "mps"}, where)
    if "pid" not in item or "gpu" not in item:
        raise BackendError(f"{where}: pid and gpu (index or UUID) are required")
    gpu = item["gpu"]
    if not isinstance(gpu, int | str) or isinstance(gpu, bool):
        raise BackendError(f"{where}.gpu: expected a GPU index or UUID, got {gpu!r}")
    mig = item.get("mig")
    if mig is not None and (not isinstance(mig, int | str) or isinstance(mig, bool)):
        raise BackendError(f"{where}.mig: expected a MIG device index or UUID, got {mig!r}")
    mem = item.get("usedMemoryMiB")
    sm = item.get("smUtil")
    mps = item.get("mps", False)
    if not isinstance(mps, bool):
        raise BackendError(f"{where}.mps: expected true or false, got {mps!r}")
    return ProcessSpec(
        pid=_positive(_int(item["pid"], f"{where}.pid"), f"{where}.pid"),
        gpu=gpu,
        mig=mig,
        used_memory_mib=None if mem is None else _int(mem, f"{where}.usedMemoryMiB"),
        sm_util_percent=None if sm is None else _int(sm, f"{where}.smUtil"),
        mps=mps,
    )


def _model(key: str, where: str) -> GpuModel:
    model = MODELS.get(key.lower())
    if model is None:
        raise BackendError(f"{where}: unknown GPU model {key!r}; known models: {known_models()}")
    return model


def _check_size(spec: NodeSpec) -> None:
    total = sum(g.count for g in spec.groups)
    if total > MAX_GPUS:
        raise BackendError(
            f"simulated node {spec.source}: {total} GPUs asked, at most {MAX_GPUS} per node"
        )


def _no_unknown(item: Mapping[object, object], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in item if k not in allowed)
    if unknown:
        raise BackendError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BackendError(f"{where}: expected a whole number, got {value!r}")
    return value


def _positive(value: int, where: str) -> int:
    if value < 1:
        raise BackendError(f"{where}: must be at least 1, got {value}")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise BackendError(f"{where}: expected a string, got {value!r}")
    return value
