"""A claim's sharing settings: NVIDIA's opaque configs, read as NVIDIA's driver reads them.

A claim written for NVIDIA's DRA driver carries `resource.nvidia.com/v1beta1` `GpuConfig` or
`MigDeviceConfig` in its opaque config (REFERENCE-DRA §5.3). gpuslice accepts them
unchanged and as strictly (an unknown field is an error, naming it), so a claim that works
there works here and a typo is not silently ignored. gpuslice's own additions live under
its own group, `resource.gpuslice.io/v1alpha1` (kind `GuardConfig`: the memory guard's
mode for the claim's devices), so nothing is ever added to NVIDIA's kinds.

Resolution follows NVIDIA's driver (§5.4): from `status.allocation.devices.config`, this
driver's entries only, class configs before claim configs and later before earlier; each
allocation result takes the highest-precedence config that names its request (a
`main/sub` result also matches `main`), else the highest one that names no request; a
config naming a request explicitly must fit the device (no `GpuConfig` on a MIG device).
The walk runs once per slot (sharing, guard) and knows no kind by name: each kind is a
module under `core.dra.opaque`, registered in `core.dra.opaque.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import ValidationError

from gpuslice.core.config.problems import problems_from
from gpuslice.core.dra.opaque.base import INTERVALS as INTERVALS
from gpuslice.core.dra.opaque.base import ClaimConfigError as ClaimConfigError
from gpuslice.core.dra.opaque.base import MpsSettings as MpsSettings
from gpuslice.core.dra.opaque.base import OpaqueKind, Slot, StrictModel
from gpuslice.core.dra.opaque.base import Sharing as Sharing
from gpuslice.core.dra.opaque.registry import KINDS
from gpuslice.core.dra.resource_claim import Allocation
from gpuslice.core.units import quantity_mib as quantity_mib

# INTERVALS, ClaimConfigError, MpsSettings, Sharing and quantity_mib are re-exported (`as`):
# the claim readers and the adapters import them from here.


def parse_opaque(
    parameters: object, where: str, kinds: Sequence[OpaqueKind[Any, Any]] = KINDS
) -> tuple[OpaqueKind[Any, Any], StrictModel]:
    """One opaque config's parameters, strictly, with the kind that read them; errors name
    `where` and the field."""
    if not isinstance(parameters, Mapping):
        raise ClaimConfigError(f"{where}: parameters must be an object")
    api, kind_name = parameters.get("apiVersion"), parameters.get("kind")
    kind = next((k for k in kinds if (k.api_version, k.kind) == (api, kind_name)), None)
    if kind is None:
        known = ", ".join(f"{k.api_version} {k.kind}" for k in kinds)
        raise ClaimConfigError(
            f"{where}: unknown config kind {kind_name!r} of apiVersion {api!r} (known: {known})"
        )
    try:
        parsed = kind.model.model_validate(dict(parameters))
    except ValidationError as exc:
        problems = "; ".join(str(p) for p in problems_from(kind.model, exc))
        raise ClaimConfigError(f"{where}.parameters: {problems}") from None
    kind.check(parsed, where)
    return kind, parsed


@dataclass(frozen=True, slots=True)
class _Entry:
    requests: tuple[str, ...]
    kind: OpaqueKind[Any, Any]
    parsed: StrictModel
    source: str


def resolve(
    allocation: Allocation | Mapping[str, Any],
    driver: str,
    kind_of: Mapping[str, Literal["gpu", "mig"]],
    kinds: Sequence[OpaqueKind[Any, Any]] = KINDS,
) -> dict[int, Sharing]:
    """For each of this driver's allocation results (by its index in `results`), the
    sharing it gets. `kind_of` maps device name -> gpu|mig. ClaimConfigError on any config
    of this driver that cannot be used (configs of other drivers are skipped unread).
    `allocation`: read (`Allocation.read`) unless it already is; `kinds`: the opaque config
    kinds read (the registry's, unless a test adds one)."""
    if not isinstance(allocation, Allocation):
        allocation = Allocation.read(allocation)
    entries: list[_Entry] = []
    for config in allocation.configs:
        if config.source not in ("FromClass", "FromClaim"):
            raise ClaimConfigError(
                f"config[{config.index}].source: must be FromClass or FromClaim, "
                f"got {config.source!r}"
            )
    ordered = sorted(allocation.configs, key=lambda c: (c.source != "FromClass", c.index))
    for config in ordered:
        if config.driver != driver:
            continue
        where = f"config[{config.index}]"
        if config.requests is None:
            raise ClaimConfigError(f"{where}.requests: must be a list of request names")
        config_kind, parsed = parse_opaque(config.parameters, f"{where}.opaque", kinds)
        entries.append(_Entry(config.requests, config_kind, parsed, where))
    slots = tuple(dict.fromkeys(k.slot for k in kinds))
    out: dict[int, Sharing] = {}
    for result in allocation.results or ():
        if result.driver != driver:
            continue
        kind = kind_of.get(result.device)
        if kind is None:
            continue  # the caller reports devices it does not know
        request = result.request
        names = {request, request.split("/", 1)[0]}
        sharing = Sharing(kind)
        for slot in slots:
            chosen = _pick(entries, names, kind, slot, request)
            if chosen is not None:
                sharing = replace(sharing, **{slot.name: _record(chosen, slot)})
        out[result.index] = sharing
    return out


def _record(entry: _Entry, slot: Slot[Any]) -> Any:
    """The kind's record for its slot, and only that slot's: a record of another type
    would overwrite another slot's fields (mypy catches it in a kind module; this, a kind
    typed loosely)."""
    record = entry.kind.contribute(entry.parsed, entry.source)
    if not isinstance(record, slot.record):
        raise TypeError(
            f"{entry.kind.kind} (slot {slot.name!r}) returned a {type(record).__name__}, "
            f"not its slot's {slot.record.__name__}"
        )
    return record


def _pick(
    entries: Sequence[_Entry],
    names: set[str],
    kind: Literal["gpu", "mig"],
    slot: Slot[Any],
    request: str,
) -> _Entry | None:
    """NVIDIA's walk, among the entries of one slot: from the highest precedence down, the
    first entry that names the request, or names no request and fits the device; naming it
    with a kind that does not fit the device is an error."""
    for entry in reversed(entries):
        if entry.kind.slot != slot:
            continue
        fits = kind in entry.kind.fits
        if names & set(entry.requests):
            if not fits:
                raise ClaimConfigError(
                    f"{entry.source}: {entry.kind.kind} names request {request!r}, "
                    f"whose device is a {kind.upper() if kind == 'mig' else 'full GPU'}"
                )
            return entry
        if not entry.requests and fits:
            return entry
    return None
