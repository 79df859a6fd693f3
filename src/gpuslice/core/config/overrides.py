"""Command-line flags and environment variables over the config file (NVIDIA's precedence:
flag, then environment, then file).

Overrides are addressed by the config path in the file's spelling (`flags.migStrategy`), so
there is one validation for both sources: a bad `MIG_STRATEGY=foo` is rejected with the same
rules and message as `migStrategy: foo` in a file, labelled with where the value came from.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Annotated, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from gpuslice.core.config.problems import model_at, problems_from, unknown_key_message
from gpuslice.core.config.schema import Config
from gpuslice.core.errors import ConfigError, FieldProblem
from gpuslice.core.jsontypes import Json


class Override(NamedTuple):
    """A value and where it came from (`--mig-strategy`, `MIG_STRATEGY`), for messages."""

    value: object
    origin: str


NVIDIA_ORIGINS = {
    "flags.migStrategy": "--mig-strategy / MIG_STRATEGY",
    "flags.failOnInitError": "--fail-on-init-error / FAIL_ON_INIT_ERROR",
    "flags.nvidiaDriverRoot": "--nvidia-driver-root / NVIDIA_DRIVER_ROOT",
    "flags.nvidiaDevRoot": "--nvidia-dev-root / NVIDIA_DEV_ROOT",
    "flags.mpsRoot": "--mps-root / MPS_ROOT",
    "flags.gdrcopyEnabled": "--gdrcopy-enabled / GDRCOPY_ENABLED",
    "flags.gdsEnabled": "--gds-enabled / GDS_ENABLED",
    "flags.mofedEnabled": "--mofed-enabled / MOFED_ENABLED",
    "flags.deviceDiscoveryStrategy": "--device-discovery-strategy / DEVICE_DISCOVERY_STRATEGY",
    "flags.plugin.passDeviceSpecs": "--pass-device-specs / PASS_DEVICE_SPECS",
    "flags.plugin.deviceListStrategy": "--device-list-strategy / DEVICE_LIST_STRATEGY",
    "flags.plugin.deviceIDStrategy": "--device-id-strategy / DEVICE_ID_STRATEGY",
    "flags.plugin.cdiAnnotationPrefix": "--cdi-annotation-prefix / CDI_ANNOTATION_PREFIX",
    "flags.plugin.nvidiaCTKPath": "--nvidia-ctk-path / NVIDIA_CTK_PATH",
    "flags.plugin.containerDriverRoot": "--container-driver-root / CONTAINER_DRIVER_ROOT",
    "flags.plugin.sharedDevicesAllocationPolicy": (
        "--shared-devices-allocation-policy / SHARED_DEVICES_ALLOCATION_POLICY"
    ),
    "imex.channelIDs": "--imex-channel-ids / IMEX_CHANNEL_IDS",
    "imex.required": "--imex-required / IMEX_REQUIRED",
}
"""Where NVIDIA's plugin takes each overridable value from (REFERENCE 8.1)."""

_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n", ""}


def _leaf_types(annotation: object) -> list[object]:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in get_args(annotation) for t in _leaf_types(arg)]
    return [annotation]


def _is_list(annotation: object) -> bool:
    return any(get_origin(t) in (tuple, list) for t in _leaf_types(annotation))


def _coerce(value: object, annotation: object) -> object:
    """Strings from the environment into the field's type; typed values pass through."""
    if not isinstance(value, str):
        return list(value) if isinstance(value, tuple) else value
    leaves = _leaf_types(annotation)
    text = value.strip()
    if bool in leaves:
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        return value
    for leaf in leaves:
        if get_origin(leaf) in (tuple, list):
            items = [p.strip() for p in text.split(",") if p.strip()]
            item_types = _leaf_types(get_args(leaf)[0])
            if int in item_types:
                return [int(p) if p.lstrip("-").isdigit() else p for p in items]
            return items
    if int in leaves and text.lstrip("-").isdigit():
        return int(text)
    return value


def _field_annotation(path: str) -> tuple[object, FieldProblem | None]:
    parts = path.split(".")
    model: type[BaseModel] | None = model_at(Config, parts[:-1])
    if model is None or not parts[-1]:
        return None, FieldProblem(path, "not a config field")
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    field = fields.get(parts[-1])
    if field is None:
        return None, FieldProblem(path, unknown_key_message(model, parts[-1]))
    return field.annotation, None


def _split(path: str, item: object) -> tuple[object, str]:
    if isinstance(item, Override):
        return item.value, item.origin
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        annotation, _ = _field_annotation(path)
        if not _is_list(annotation) or isinstance(item[0], list | tuple):
            return item[0], item[1]
    return item, NVIDIA_ORIGINS.get(path, "command line or environment")


def _set(doc: Json, path: str, value: object) -> None:
    *sections, key = path.split(".")
    node = doc
    for section in sections:
        child = node.get(section)
        if not isinstance(child, dict):
            child = node[section] = {}
        node = child
    node[key] = value


def apply_overrides(config: Config, overrides: Mapping[str, object]) -> Config:
    """`config` with each `path -> value` (or `path -> (value, origin)`) applied.

    A value of None is no override. Strings are read as the environment spells them
    (`true`, `1`, comma-separated lists). Raises ConfigError naming the flag or variable.
    """
    doc: Json = config.model_dump(by_alias=True)
    origins: dict[str, str] = {}
    problems: list[FieldProblem] = []
    for path, item in overrides.items():
        value, origin = _split(path, item)
        if value is None:
            continue
        annotation, problem = _field_annotation(path)
        if problem is not None:
            problems.append(FieldProblem(f"{path} (set by {origin})", problem.message))
            continue
        origins[path] = origin
        _set(doc, path, _coerce(value, annotation))
    if problems:
        raise ConfigError(problems, source="overrides")
    try:
        return Config.model_validate(doc)
    except ValidationError as exc:
        relabelled = [_relabel(p, origins) for p in problems_from(Config, exc)]
        raise ConfigError(relabelled, source="overrides") from None


def _relabel(problem: FieldProblem, origins: Mapping[str, str]) -> FieldProblem:
    for path, origin in origins.items():
        if problem.path == path or problem.path.startswith((path + ".", path + "[")):
            return FieldProblem(f"{problem.path} (set by {origin})", problem.message)
    return problem
