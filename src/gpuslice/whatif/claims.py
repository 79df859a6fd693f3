"""What ResourceClaims would get on a node in DRA mode, before anything is applied.

`gpuslice describe --claims` answers, for claims a user is about to create: which device of
this node each request gets, how it is shared, what its containers are told, and how much
memory the memory guard lets each pod hold. Nothing here is estimated a second way: the
node's slices come from the publisher's functions (`core.dra.publish`), each claim is
allocated by the scheduler's rules (`whatif.allocator.allocate`, the CEL and capacity rules),
and what Prepare would do comes from the driver's core (`core.dra.claims.claim_work`,
`core.dra.preparation`, `cdispec.claim_spec`, `claimplan.claims_plan`,
`attribution.entitlement_of`). Claims are taken in file order and each allocation counts
as in use for the next ones, as on a real node, so the fifth claim on a GPU shared four ways
gets the scheduler's refusal.

It lives beside the allocator (`whatif.allocator`), not in the core, because the allocator
evaluates CEL (`celpy`); it is a product command's engine, so it is not in `emulator` either.
`slice_devices` also summarises slices the running driver published (the DRA demo).
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from gpuslice.core.attribution import entitlement_of
from gpuslice.core.cdi.spec import CdiDevice
from gpuslice.core.config.parsing import load_documents
from gpuslice.core.devices import Inventory, MigDevice
from gpuslice.core.dra.cdispec import claim_spec
from gpuslice.core.dra.claimplan import claims_plan
from gpuslice.core.dra.claims import (
    ClaimError,
    ClaimWork,
    DeviceWork,
    claim_work,
)
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.partitions import WOULD_BE_UUID, with_consumption, would_be
from gpuslice.core.dra.preparation import preparation
from gpuslice.core.dra.prepared import DeviceUse, PreparedClaim
from gpuslice.core.dra.publish import (
    REPLICAS,
    SHARES_CAPACITY,
    DraDevice,
    SharesMode,
    device_json,
    slice_specs,
)
from gpuslice.core.dra.sharing import INTERVALS
from gpuslice.core.errors import ConfigError, GpusliceError
from gpuslice.core.jsontypes import Json
from gpuslice.core.policy import DraOffer, NodePolicy
from gpuslice.core.sharing.model import Plan, SharingStrategy
from gpuslice.core.units import MIB, quantity_mib
from gpuslice.whatif.allocator import AllocationError, allocate

DRIVER = "gpu.nvidia.com"
POOL = "node-1"
"""The pool (node name) the what-if publishes under: any name does, it only has to agree."""
MPS_ROOT = f"/var/lib/kubelet/plugins/{DRIVER}/mps"
"""Where the agent keeps claim MPS daemons by default (`<DRA plugin dir>/mps`)."""


def _device_class(name: str, kind: str) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{DRIVER}' && "
                        f"device.attributes['{DRIVER}'].type == '{kind}'"
                    }
                }
            ]
        },
    }


DEFAULT_DEVICE_CLASSES: tuple[Json, ...] = (
    _device_class("gpu.nvidia.com", "gpu"),
    _device_class("mig.nvidia.com", "mig"),
)
"""NVIDIA's DeviceClasses, as its Helm chart installs them."""


class ClaimsFileError(GpusliceError):
    """A claims or DeviceClass file that cannot be read; the text names the document."""


# -- input -------------------------------------------------------------------------------------


def _documents(text: str, source: str) -> list[tuple[str, Json]]:
    """(where, object) for every object of a multi-document YAML (or `kubectl -o json`),
    `kind: List` unpacked. Loaded by the config loader, under its bounds on nesting, alias
    expansion and integer size, with date-like scalars left as the strings Kubernetes
    sees."""
    try:
        docs = load_documents(text, source, timestamps=False)
    except ConfigError as exc:
        raise ClaimsFileError(f"{source}: " + "; ".join(map(str, exc.problems))) from None
    out: list[tuple[str, Json]] = []
    for i, doc in enumerate(docs):
        where = f"{source}: document {i + 1}"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ClaimsFileError(f"{where}: not an object ({type(doc).__name__})")
        if doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise ClaimsFileError(f"{where}: kind List without an items list")
            for j, item in enumerate(items):
                if not isinstance(item, dict):
                    raise ClaimsFileError(f"{where}: items[{j}]: not an object")
                out.append((f"{where}, items[{j}]", item))
        else:
            out.append((where, doc))
    return out


def _name(obj: Json, where: str) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ClaimsFileError(f"{where}: metadata.name is missing")
    return name


def _check_request(req: object, where: str) -> None:
    if not isinstance(req, dict) or not isinstance(req.get("name"), str) or not req["name"]:
        raise ClaimsFileError(f"{where}: a request needs a name")
    bodies: list[tuple[str, object]] = []
    if "exactly" in req:
        bodies.append((f"{where}.exactly", req["exactly"]))
    elif isinstance(req.get("firstAvailable"), list) and req["firstAvailable"]:
        bodies += [(f"{where}.firstAvailable[{i}]", b) for i, b in enumerate(req["firstAvailable"])]
    else:
        raise ClaimsFileError(f"{where}: needs exactly or a firstAvailable list")
    for at, body in bodies:
        if not isinstance(body, dict) or not isinstance(body.get("deviceClassName"), str):
            raise ClaimsFileError(f"{at}.deviceClassName is missing")
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int):
            raise ClaimsFileError(f"{at}.count: must be an integer, got {count!r}")
        selectors = body.get("selectors", [])
        if not isinstance(selectors, list) or not all(
            isinstance(s, dict) and isinstance((s.get("cel") or {}).get("expression"), str)
            for s in selectors
        ):
            raise ClaimsFileError(f"{at}.selectors: each needs cel.expression (a string)")


def load_claims(text: str, source: str = "claims") -> list[Json]:
    """The ResourceClaims of a file (ResourceClaimTemplates read as the claim they make),
    namespace `default` when none is given. ClaimsFileError for anything malformed."""
    claims: list[Json] = []
    seen: set[tuple[str, str]] = set()
    for where, obj in _documents(text, source):
        kind = obj.get("kind")
        name = _name(obj, where)
        if kind == "ResourceClaimTemplate":
            spec = (obj.get("spec") or {}).get("spec")
        elif kind == "ResourceClaim":
            spec = obj.get("spec")
        else:
            raise ClaimsFileError(f"{where} ({name}): kind {kind!r} is not a ResourceClaim")
        where = f"{where} ({name})"
        devices = spec.get("devices") if isinstance(spec, dict) else None
        requests = devices.get("requests") if isinstance(devices, dict) else None
        if not isinstance(devices, dict) or not isinstance(requests, list) or not requests:
            raise ClaimsFileError(f"{where}: spec.devices.requests must be a non-empty list")
        for i, req in enumerate(requests):
            _check_request(req, f"{where}: spec.devices.requests[{i}]")
        config = devices.get("config", [])
        if not isinstance(config, list) or not all(isinstance(c, dict) for c in config):
            raise ClaimsFileError(f"{where}: spec.devices.config must be a list of objects")
        meta = dict(obj.get("metadata") or {})
        meta.setdefault("namespace", "default")
        key = (str(meta["namespace"]), name)
        if key in seen:
            raise ClaimsFileError(f"{where}: claim {key[0]}/{key[1]} appears twice")
        seen.add(key)
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": meta,
                "spec": copy.deepcopy(spec),
            }
        )
    if not claims:
        raise ClaimsFileError(f"{source}: no ResourceClaim in the file")
    return claims


def load_device_classes(text: str, source: str = "device classes") -> list[Json]:
    classes: list[Json] = []
    for where, obj in _documents(text, source):
        name = _name(obj, where)
        if obj.get("kind") != "DeviceClass":
            raise ClaimsFileError(f"{where} ({name}): kind {obj.get('kind')!r} is not DeviceClass")
        selectors = (obj.get("spec") or {}).get("selectors", [])
        if not isinstance(selectors, list):
            raise ClaimsFileError(f"{where} ({name}): spec.selectors must be a list")
        classes.append(obj)
    if not classes:
        raise ClaimsFileError(f"{source}: no DeviceClass in the file")
    return classes


# -- the node's devices ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One published device, as `kubectl get resourceslices -o yaml` would show it."""

    name: str
    type: str
    """`gpu` or `mig` (the `type` attribute the DeviceClasses select on)."""
    product: str
    profile: str | None
    memory_mib: int
    uuid: str
    shares: int | None = None
    """Offered as this many consumable shares (`allowMultipleAllocations`); None: whole."""
    share_memory_mib: int | None = None
    """Memory one share gets unless its request asks for more (the requestPolicy default)."""


def _attr(device: Json, name: str) -> str | None:
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, dict):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def slice_devices(slices: Sequence[Json]) -> tuple[SliceDevice, ...]:
    """The devices of ResourceSlice objects (or their specs), in slice then device order."""
    out: list[SliceDevice] = []
    for obj in slices:
        spec = obj.get("spec", obj)
        for device in spec.get("devices") or ():
            capacity = device.get("capacity") or {}
            memory = capacity.get("memory") or {}
            shares = (
                capacity.get(SHARES_CAPACITY) if device.get("allowMultipleAllocations") else None
            )
            policy = memory.get("requestPolicy") or {}
            out.append(
                SliceDevice(
                    name=str(device["name"]),
                    type=_attr(device, "type") or "?",
                    product=_attr(device, "productName") or "",
                    profile=_attr(device, "profile"),
                    memory_mib=quantity_mib(memory["value"]) if "value" in memory else 0,
                    # a dynamic MIG partition has no UUID until Prepare creates it
                    uuid=_attr(device, "uuid")
                    or (WOULD_BE_UUID if "consumesCounters" in device else ""),
                    shares=int(str(shares["value"])) if shares else None,
                    share_memory_mib=(
                        _default_mib(policy["default"]) if shares and "default" in policy else None
                    ),
                )
            )
    return tuple(out)


def _default_mib(value: object) -> int:
    """A memory policy's default in MiB; 0 where it is none (NVIDIA's count mode), which
    `quantity_mib` refuses as below 1Mi."""
    return 0 if str(value).strip() == "0" else quantity_mib(value)


def node_slices(
    inventory: Inventory,
    plan: Plan,
    *,
    driver: str,
    node: str,
    shares: SharesMode = REPLICAS,
    dynamic: Collection[str] = (),
) -> list[Json]:
    """The ResourceSlice objects the agent would publish for this inventory and plan (all
    devices healthy) with `--consumable-shares shares`, with the publisher's own functions;
    the GPUs `dynamic` marks as dynamic MIG ones (`core.dra.partitions`)."""
    offer = NodePolicy(plan, inventory).offer(shares, dynamic=dynamic)
    return offer_slices(offer, driver=driver, node=node)


def offer_slices(offer: DraOffer, *, driver: str, node: str) -> list[Json]:
    """The ResourceSlice objects publishing `offer` (all devices healthy)."""
    dyn = offer.dynamic
    devices = [
        with_consumption(device_json(d, []), dyn[d.gpu.uuid])
        if d.gpu.uuid in dyn
        else device_json(d, [], offer.shares.get(d.uuid))
        for d in offer.devices
    ]
    specs = slice_specs(
        devices, driver=driver, node=node, generation=1, counter_sets=offer.counter_sets()
    )
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver.replace('.', '-')}-{i}"},
            "spec": spec,
        }
        for i, spec in enumerate(specs)
    ]


# -- what each claim gets ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareInfo:
    """A consumable share of a GPU the node's config shares N ways."""

    share_id: str
    shares: int
    replicas: int
    memory_mib: int
    strategy: str


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str


@dataclass(frozen=True, slots=True)
class DeviceOutcome:
    request: str
    device: str
    type: str
    product: str
    profile: str | None
    memory_mib: int
    uuid: str
    sharing: SharingStrategy
    """NONE, TIME_SLICING or MPS, printed as its `entitlement_kind`."""
    sharing_text: str
    """The sharing in words: what a user needs to know about the device's other tenants."""
    config: str
    """Which opaque config entry decided the sharing (`config[1]`), or `default`."""
    interval: str | None = None
    """Time-slicing: the interval Prepare sets (NVIDIA's names); None: left as it is."""
    mps_thread_percentage: int | None = None
    mps_pinned_limit_mib: int | None = None
    share: ShareInfo | None = None
    env: tuple[tuple[str, str], ...] = ()
    """The container env of the device's CDI entry, in the spec's order."""
    mounts: tuple[Mount, ...] = ()
    entitlement: SharingStrategy = SharingStrategy.NONE
    """The memory guard's view of one pod: exclusive (NONE), time-slicing, mps or mig."""
    entitlement_mib: int = 0
    """Memory one pod holding the claim may use before the guard acts."""
    sm_fraction: float | None = None
    placement: str | None = None
    """A MIG device's placement, `start:size` in memory slices."""
    created_at_prepare: bool = False
    """A dynamic MIG partition: Prepare creates the MIG device (`uuid` is a stand-in)."""


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    namespace: str
    name: str
    fits: bool
    error: str = ""
    """The scheduler double's or the driver's refusal, word for word."""
    stage: Literal["", "allocate", "prepare"] = ""
    devices: tuple[DeviceOutcome, ...] = ()
    guard_mode: str | None = None
    """GuardConfig `mode` for this claim's pods; None: the node's setting."""
    warnings: tuple[str, ...] = ()
    """What Prepare would post as Warning Events: what the claim asked and does not get
    (its TimeSlicing config on a share)."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    driver: str
    pool: str
    devices: tuple[SliceDevice, ...]
    claims: tuple[ClaimOutcome, ...]

    @property
    def all_fit(self) -> bool:
        return all(c.fits for c in self.claims)


_INTERVAL_NAMES = {v: k for k, v in INTERVALS.items()}


def _ids(claim: Json) -> tuple[str, str, str]:
    meta = claim.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
    uid = str(meta.get("uid") or uuid.uuid5(uuid.NAMESPACE_URL, f"gpuslice-whatif:{ns}/{name}"))
    return ns, name, uid


def _uses_and_cdi(
    work: ClaimWork, uid: str, mps_root: str
) -> tuple[list[DeviceUse], list[CdiDevice], dict[str, tuple[int | None, int | None]]]:
    """What the driver's Prepare records and writes for `work` (the same
    `core.dra.preparation`, without running its steps): device uses for the guard, CDI
    devices, and per MPS device (thread %, pinned MiB)."""
    prepared = preparation(work, mps_root)
    mps = {
        u.device: (u.thread_percentage, u.entitlement_mib)
        for u in prepared.uses
        if u.strategy == SharingStrategy.MPS
    }
    return list(prepared.uses), list(prepared.cdi), mps


def _words(
    dw: DeviceWork, mps: tuple[int | None, int | None] | None
) -> tuple[SharingStrategy, str]:
    share, sharing = dw.share, dw.sharing
    if share is not None:
        how = "MPS" if share.strategy == SharingStrategy.MPS else "time-slicing"
        if share.memory_mib:
            memory = f"{share.memory_mib} MiB"
        elif not dw.device.capacity.get("memory"):  # a unified-memory GPU: shares by count
            memory = "no memory figure"
        else:
            memory = "no memory reserved"
        text = f"{share.shares} of {share.replicas} shares ({how}), {memory}"
        if share.strategy != SharingStrategy.MPS and share.memory_mib:
            text += " (not enforced by the GPU)"  # time-slicing: the memory reserved
        if share.cores and share.strategy == SharingStrategy.MPS:
            text += (
                f", {share.cores}% of the SMs (cores: the MPS client's active thread percentage)"
            )
        elif share.cores:
            text += (
                f", {share.cores}% of the SMs (cores) reserved for the scheduler only: "
                "time-slicing does not limit a process to a share of the SMs, so it is "
                "not enforced"
            )
        return share.strategy, text
    if sharing.shares is SharingStrategy.MPS:
        pct, limit = mps or (None, None)
        mig = dw.device.kind == "mig"
        where = " on the MIG device (its own daemon sees only it)" if mig else ""
        text = f"MPS{where}: {pct if pct is not None else 100}% of SMs per client"
        text += f", pinned memory limit {limit} MiB" if limit is not None else ", no memory limit"
        if sharing.mps is not None and sharing.mps.multi_user:
            text += ", multi-user daemon (clients of any user ID)"
        return SharingStrategy.MPS, text
    shared_by = sharing.shared_by or 1
    if sharing.shares is SharingStrategy.TIME_SLICING or shared_by > 1:
        interval = _INTERVAL_NAMES.get(sharing.interval) if sharing.interval is not None else None
        text = "time-slicing"
        text += f", interval {interval}" if interval else " (interval left as it is)"
        if shared_by > 1:
            text += f", meant for {shared_by} pods (GuardConfig sharedBy)"
        return SharingStrategy.TIME_SLICING, text
    what = "MIG device" if dw.device.kind == "mig" else "GPU"
    return SharingStrategy.NONE, f"exclusive: the whole {what}, for the pods of this claim"


def _outcomes(
    work: ClaimWork, uid: str, inventory: Inventory, pool: str, mps_root: str
) -> tuple[tuple[DeviceOutcome, ...], str | None]:
    uses, cdi, mps = _uses_and_cdi(work, uid, mps_root)
    spec = claim_spec(uid, cdi)
    edits = {entry["name"]: entry["containerEdits"] for entry in spec["devices"]}
    ns, name = work.ref.namespace, work.ref.name
    prepared = PreparedClaim(uid, ns, name, "PrepareCompleted", uses=tuple(uses))
    plan = claims_plan([prepared], inventory, pool)
    advertised = plan.resources[0].devices if plan.resources else ()
    sms = {g.uuid: g.multiprocessors for g in inventory.gpus}
    out: list[DeviceOutcome] = []
    for dw, adv in zip(work.devices, advertised, strict=True):
        device: DraDevice = dw.device
        edit = edits[f"{uid}-{device.name}"]
        env = tuple(tuple(e.split("=", 1)) for e in edit["env"])
        mounts = tuple(Mount(m["hostPath"], m["containerPath"]) for m in edit.get("mounts", ()))
        ent = entitlement_of(adv, sms.get(device.gpu.uuid))
        kind, text = _words(dw, mps.get(device.name))
        pct, limit = mps.get(device.name, (None, None))
        share = None
        if dw.share is not None and dw.share_id is not None:
            s = dw.share
            share = ShareInfo(dw.share_id, s.shares, s.replicas, s.memory_mib, str(s.strategy))
        interval = None
        if dw.sharing.interval is not None:
            interval = _INTERVAL_NAMES.get(dw.sharing.interval)
        out.append(
            DeviceOutcome(
                request=dw.request,
                device=device.name,
                type=device.kind,
                product=device.gpu.product_name,
                profile=device.mig.profile if device.mig is not None else None,
                placement=(
                    f"{device.mig.placement_start}:{device.mig.placement_size}"
                    if device.mig is not None
                    else None
                ),
                created_at_prepare=device.uuid.startswith(WOULD_BE_UUID),
                memory_mib=device.capacity.get("memory", 0) // MIB,
                uuid=device.uuid,
                sharing=kind,
                sharing_text=text,
                config=dw.sharing.source,
                interval=interval,
                mps_thread_percentage=pct,
                mps_pinned_limit_mib=limit,
                share=share,
                env=tuple((k, v) for k, v in env),
                mounts=mounts,
                entitlement=ent.kind,
                entitlement_mib=ent.memory_bytes // MIB,
                sm_fraction=None if ent.sm_fraction is None else round(ent.sm_fraction, 6),
            )
        )
    return tuple(out), work.guard_mode


def _share_ids(ns: str, name: str) -> Callable[[], str]:
    """Share IDs the same at every run (the scheduler draws random ones), so the output of
    `describe --claims` can be compared between runs."""
    counter = itertools.count(1)
    return lambda: str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"gpuslice-whatif:{ns}/{name}/{next(counter)}")
    )


def what_if(
    inventory: Inventory,
    plan: Plan,
    claims: Sequence[Json],
    classes: Sequence[Json] = DEFAULT_DEVICE_CLASSES,
    *,
    driver: str = DRIVER,
    pool: str = POOL,
    mps_root: str = MPS_ROOT,
    shares: SharesMode = REPLICAS,
    dynamic: Collection[str] = (),
) -> WhatIf:
    """Allocate then "prepare" each claim in order on the node `inventory` + `plan` describe,
    its devices offered as `--consumable-shares shares` would, the GPUs `dynamic` marks
    publishing dynamic MIG partitions: a claim allocated one gets the MIG device Prepare
    would create (`partitions.would_be`), and the scheduler's refusal names the counters
    that are used up.

    Raises ClaimsFileError only for a claim the allocator cannot even read; a claim that
    does not fit or that the driver would refuse is an outcome with its error.
    """
    offer = NodePolicy(plan, inventory).offer(shares, dynamic=dynamic)
    slices = offer_slices(offer, driver=driver, node=pool)
    devices = offer.by_name()
    parts = offer.partitions()
    offers = offer.offers_by_name()
    made: dict[str, list[MigDevice]] = {}
    """GPU UUID -> the MIG devices the claims so far would have created on it."""
    in_use: list[Json] = []
    outcomes: list[ClaimOutcome] = []
    for claim in claims:
        ns, name, uid = _ids(claim)
        try:
            allocation = allocate(
                claim, list(classes), slices, in_use, node=pool, share_id=_share_ids(ns, name)
            )
        except AllocationError as exc:
            outcomes.append(ClaimOutcome(ns, name, False, str(exc), "allocate"))
            continue
        except (KeyError, TypeError, ValueError) as exc:
            raise ClaimsFileError(
                f"ResourceClaim {ns}/{name}: cannot be read: {type(exc).__name__}: {exc}"
            ) from None
        # allocated stays allocated, as on a real node, even if Prepare then refuses it
        in_use.append(allocation)
        allocated = copy.deepcopy(dict(claim))
        allocated["metadata"] = dict(allocated.get("metadata") or {}, namespace=ns, uid=uid)
        allocated["status"] = {"allocation": allocation}
        ref = ClaimRef(ns, uid, name)
        claim_devices = dict(devices)
        for result in allocation["devices"]["results"]:
            part = parts.get(str(result.get("device")))
            if part is not None:
                held = made.setdefault(part.gpu.uuid, [])
                mig = would_be(part, held)
                held.append(mig)
                claim_devices[part.name] = replace(devices[part.name], uuid=mig.uuid, mig=mig)
        try:
            work = claim_work(
                allocated, ref, driver=driver, pool=pool, devices=claim_devices, offers=offers
            )
            found, guard = _outcomes(work, uid, _with(inventory, made), pool, mps_root)
        except ClaimError as exc:
            outcomes.append(ClaimOutcome(ns, name, False, str(exc), "prepare"))
            continue
        outcomes.append(
            ClaimOutcome(ns, name, True, devices=found, guard_mode=guard, warnings=work.notices)
        )
    return WhatIf(driver, pool, slice_devices(slices), tuple(outcomes))


def _with(inventory: Inventory, made: Mapping[str, Sequence[MigDevice]]) -> Inventory:
    """`inventory` with the MIG devices Prepare would have created (attribution and the
    guard see them as they would see the real ones)."""
    if not made:
        return inventory
    gpus = tuple(
        replace(g, mig_devices=(*g.mig_devices, *made.get(g.uuid, ()))) for g in inventory.gpus
    )
    return replace(inventory, gpus=gpus)


def what_if_to_dict(report: WhatIf) -> dict[str, object]:
    """JSON/YAML-safe data (docs/schemas/describe-claims.schema.json)."""
    return {
        "driver": report.driver,
        "pool": report.pool,
        "all_fit": report.all_fit,
        "devices": [
            {
                "name": d.name,
                "type": d.type,
                "product": d.product,
                "profile": d.profile,
                "memory_mib": d.memory_mib,
                "uuid": d.uuid,
                "shares": d.shares,
                "share_memory_mib": d.share_memory_mib,
            }
            for d in report.devices
        ],
        "claims": [_claim_dict(c) for c in report.claims],
    }


def _claim_dict(c: ClaimOutcome) -> dict[str, object]:
    return {
        "namespace": c.namespace,
        "name": c.name,
        "fits": c.fits,
        "error": c.error,
        "stage": c.stage,
        "guard_mode": c.guard_mode,
        "warnings": list(c.warnings),
        "devices": [
            {
                "request": d.request,
                "device": d.device,
                "type": d.type,
                "product": d.product,
                "profile": d.profile,
                "placement": d.placement,
                "created_at_prepare": d.created_at_prepare,
                "memory_mib": d.memory_mib,
                "uuid": d.uuid,
                "sharing": d.sharing.entitlement_kind,
                "sharing_text": d.sharing_text,
                "config": d.config,
                "interval": d.interval,
                "mps_thread_percentage": d.mps_thread_percentage,
                "mps_pinned_limit_mib": d.mps_pinned_limit_mib,
                "share": None
                if d.share is None
                else {
                    "share_id": d.share.share_id,
                    "shares": d.share.shares,
                    "replicas": d.share.replicas,
                    "memory_mib": d.share.memory_mib,
                    "strategy": d.share.strategy,
                },
                "env": dict(d.env),
                "mounts": [
                    {"host_path": m.host_path, "container_path": m.container_path} for m in d.mounts
                ],
                "entitlement": {
                    "kind": d.entitlement.entitlement_kind,
                    "memory_mib": d.entitlement_mib,
                    "sm_fraction": d.sm_fraction,
                },
            }
            for d in c.devices
        ],
    }


def offered(devices: Sequence[SliceDevice]) -> Mapping[str, int]:
    """Device counts by type (`gpu`, `mig`) and shares on offer (`shares`)."""
    counts: dict[str, int] = {}
    for d in devices:
        counts[d.type] = counts.get(d.type, 0) + 1
        if d.shares:
            counts["shares"] = counts.get("shares", 0) + d.shares
    return counts
