"""The parts of a stored `resource.k8s.io/v1` ResourceSlice that publishing compares, typed
once: its name, its spec and its pool's generation. Reading never raises (a slice of the
wrong shape reads as nameless, generation 0), since what the API holds is compared with
what this node wants, and a damaged slice is simply one that differs and is rewritten."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredSlice:
    name: str
    """`metadata.name` ("" when missing)."""
    spec: object
    """`spec` as stored, compared whole with the wanted one."""
    generation: int
    """`spec.pool.generation`; 0 when missing or not a whole number."""
    obj: Mapping[str, Any]
    """The object as read: an update sends it back with the new spec (`resourceVersion`
    kept, so a concurrent writer's change is not overwritten)."""

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> StoredSlice:
        metadata = obj.get("metadata")
        name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
        spec = obj.get("spec")
        return cls(str(name), spec, _generation(spec), obj)


def _generation(spec: object) -> int:
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    value = pool.get("generation") if isinstance(pool, Mapping) else None
    if not isinstance(value, int | float | str):
        return 0
    try:
        return int(value)
    except (ValueError, OverflowError):
        return 0
