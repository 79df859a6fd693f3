"""The scheduler's side of DRA (structured parameters): the scheduler double, the demo and
`describe --claims`.

`allocate` computes a ResourceClaim's `status.allocation` from DeviceClasses, the
ResourceSlices and the allocations other claims already hold, as kube-scheduler's DRA
plugin does (REFERENCE-DRA §3.2-§3.6): DeviceClass and request CEL selectors (all must
hold), `ExactCount` / `All`, `firstAvailable` subrequests, `matchAttribute` and
`distinctAttribute` constraints, device taints against request tolerations, shared
counters (partitionable devices) and consumable capacity (`allowMultipleAllocations`, with
`shareID` and `consumedCapacity` in the result). Class configs then claim configs are copied
into the result, class first, as the scheduler does, since drivers rank later entries higher.

It is pure apart from evaluating CEL with `celpy` and drawing share IDs (injectable). Choices
where a simple rule does as well as the scheduler's for a single-node emulator:

* devices are tried in slice order, then device order, depth-first with backtracking, so the
  first allocation found is deterministic (constraints and `firstAvailable` fall back to
  later candidates instead of failing on the first greedy pick);
* only the highest `pool.generation` of each (driver, pool) counts, and a pool with fewer
  slices at that generation than its `resourceSliceCount` is skipped, as an incomplete pool
  is by the scheduler (the kubelet wipes and the driver republishes slices); a pool with a
  device consuming a counter it does not define is invalid, and no claim is allocated on
  that node, as the scheduler refuses it ("invalid resource pools were encountered");
* a CEL runtime error means "this device does not match"; the first error's text is shown
  when no device matched. An unknown attribute domain reads as an empty map, so
  `has(device.attributes['x'].y)` is false there.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError, CELUnsupportedError

from gpuslice.core.jsontypes import Json
from gpuslice.core.units import Quantity

SEARCH_STEP_LIMIT = 200_000
"""Candidate tries per `allocate` call before giving up (a claim with many requests and
constraints that cannot all hold would otherwise try every combination)."""
_SHOWN_REASONS = 4


class AllocationError(Exception):
    """No allocation: the message names the claim, the request and why."""


def _new_share_id() -> str:
    return str(uuid.uuid4())


# -- values: Kubernetes quantities and semantic versions -----------------------------------

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


class Version:
    """A semantic version (2.0.0): ordered by precedence, build metadata ignored."""

    __slots__ = ("major", "minor", "patch", "pre", "text")

    def __init__(self, text: str) -> None:
        m = _SEMVER.match(text)
        if m is None:
            raise ValueError(f"not a semantic version: {text!r}")
        self.text = text
        self.major, self.minor, self.patch = int(m.group(1)), int(m.group(2)), int(m.group(3))
        self.pre = tuple(m.group(4).split(".")) if m.group(4) else ()

    def compare(self, other: object) -> int:
        if not isinstance(other, Version):
            raise TypeError(f"no such overload: version and {type(other).__name__}")
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if self.pre == other.pre:
            return 0
        if not self.pre or not other.pre:  # a release ranks above its pre-releases
            return 1 if not self.pre else -1
        for a, b in zip(self.pre, other.pre, strict=False):
            if a == b:
                continue
            if a.isdigit() and b.isdigit():
                return -1 if int(a) < int(b) else 1
            if a.isdigit() != b.isdigit():  # numeric identifiers rank below others
                return -1 if a.isdigit() else 1
            return -1 if a < b else 1
        return -1 if len(self.pre) < len(other.pre) else 1

    def __repr__(self) -> str:
        return f"Version({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return self.compare(other) == 0

    def __ne__(self, other: object) -> bool:
        return self.compare(other) != 0

    def __lt__(self, other: object) -> bool:
        return self.compare(other) < 0

    def __le__(self, other: object) -> bool:
        return self.compare(other) <= 0

    def __gt__(self, other: object) -> bool:
        return self.compare(other) > 0

    def __ge__(self, other: object) -> bool:
        return self.compare(other) >= 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))


# -- CEL ----------------------------------------------------------------------------------


def _compare(a: object, b: object) -> int:
    if isinstance(a, Version):
        return a.compare(b)
    if isinstance(a, Quantity):
        other = a._other(b)
        return (a.value > other) - (a.value < other)
    raise TypeError(f"no such overload: compareTo on {type(a).__name__}")


def _quantity_of(a: object) -> Quantity:
    if not isinstance(a, Quantity):
        raise TypeError(f"no such overload: {type(a).__name__} is not a quantity")
    return a


def _version_of(a: object) -> Version:
    if not isinstance(a, Version):
        raise TypeError(f"no such overload: {type(a).__name__} is not a version")
    return a


def _cel_semver(text: object) -> Version | CELEvalError:
    try:
        return Version(str(text))
    except ValueError as exc:
        return CELEvalError(f"semver: {exc}", ValueError, None)


def _cel_quantity(text: object) -> Quantity | CELEvalError:
    try:
        return Quantity.parse(str(text))
    except ValueError as exc:
        return CELEvalError(f"quantity: {exc}", ValueError, None)


def _is(parse: Callable[[str], object]) -> Callable[[object], celtypes.BoolType]:
    def check(text: object) -> celtypes.BoolType:
        try:
            parse(str(text))
        except ValueError:
            return celtypes.BoolType(False)
        return celtypes.BoolType(True)

    return check


def _quantity_plus(a: object, b: object, sign: int) -> Quantity:
    q = _quantity_of(a)
    other = Quantity(int(b)) if isinstance(b, int) and not isinstance(b, bool) else b
    return Quantity(q.value + sign * _quantity_of(other).value, q.binary)


def _as_integer(a: object) -> celtypes.IntType:
    q = _quantity_of(a)
    if q.value.denominator != 1:
        raise ValueError(f"{q} is not an integer")
    return celtypes.IntType(int(q.value))


_CEL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "semver": _cel_semver,
    "isSemver": _is(Version),
    "quantity": _cel_quantity,
    "isQuantity": _is(Quantity.parse),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "major": lambda v: celtypes.IntType(_version_of(v).major),
    "minor": lambda v: celtypes.IntType(_version_of(v).minor),
    "patch": lambda v: celtypes.IntType(_version_of(v).patch),
    "sign": lambda q: celtypes.IntType((_quantity_of(q).value > 0) - (q.value < 0)),
    "isInteger": lambda q: celtypes.BoolType(_quantity_of(q).value.denominator == 1),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(_quantity_of(q).value)),
    "add": lambda a, b: _quantity_plus(a, b, 1),
    "sub": lambda a, b: _quantity_plus(a, b, -1),
}
"""Kubernetes' CEL libraries for versions and quantities, as far as selectors use them.
celpy calls `x.f(y)` as `f(x, y)`."""


class _Domains(celtypes.MapType):
    """`device.attributes` / `device.capacity`: domain -> name -> value; an unknown domain
    is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


class _Cel:
    """The selectors of one `allocate` call, each compiled once."""

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._programs: dict[str, celpy.Runner] = {}

    def program(self, expression: str, where: str) -> celpy.Runner:
        runner = self._programs.get(expression)
        if runner is None:
            try:
                ast = self._env.compile(expression)
            except Exception as exc:  # celpy raises its parse errors and lark's
                raise AllocationError(
                    f"{where}: CEL expression {expression!r} does not compile: {_first_line(exc)}"
                ) from exc
            runner = self._env.program(ast, functions=_CEL_FUNCTIONS)
            self._programs[expression] = runner
        return runner

    @staticmethod
    def matches(runner: celpy.Runner, device: celtypes.MapType) -> bool | str:
        """True/False, or the runtime error's text (the device then does not match)."""
        try:
            result = runner.evaluate({"device": device})
        except CELEvalError as exc:
            return _cel_error_text(exc)
        except (CELUnsupportedError, TypeError, ValueError, KeyError, ArithmeticError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if not isinstance(result, celtypes.BoolType):
            return f"the expression returned {type(result).__name__}, not bool"
        return bool(result)


def _cel_error_text(exc: CELEvalError) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    text = text.split(" (in activation", 1)[0]
    cause = exc.__cause__
    if text == "no such overload" and cause is not None and cause.args:
        text = f"{text}: {cause.args[0]}"
    return text[:300]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _cel_value(value: Json) -> Any:
    """An attribute's value for CEL; None for a type this emulator does not know."""
    if "string" in value:
        return celtypes.StringType(value["string"])
    if "bool" in value:
        return celtypes.BoolType(bool(value["bool"]))
    if "int" in value:
        return celtypes.IntType(int(value["int"]))
    if "version" in value:
        try:
            return Version(str(value["version"]))
        except ValueError:
            return celtypes.StringType(str(value["version"]))
    for kind in ("strings", "ints", "bools", "versions"):  # list attributes (1.36 alpha)
        if kind in value:
            return celtypes.ListType([_cel_value({kind[:-1]: v}) for v in value[kind]])
    return None


def _qualified(name: str, driver: str) -> tuple[str, str]:
    """(domain, identifier); names without a domain belong to the driver's."""
    domain, _, ident = name.rpartition("/")
    return (domain or driver), ident


# -- the devices on offer ------------------------------------------------------------------

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): a device's identity in the cluster."""
CounterKey = tuple[str, str, str, str]
"""(driver, pool, counter set, counter)."""
CapacityKey = tuple[str, str]
"""(domain, identifier) of a capacity; a request's key has domain "" for the driver's."""


@dataclass(slots=True)
class _Device:
    key: DeviceKey
    spec: Json
    node: str | None
    """The slice's `nodeName` (None for `allNodes` slices)."""
    multi: bool
    """`allowMultipleAllocations`: its capacity is consumed per allocation."""
    capacity: dict[CapacityKey, tuple[str, Quantity]]
    """(domain, identifier) -> (the name as published, value)."""
    counters: dict[CounterKey, Fraction]
    """What allocating it takes from its pool's shared counters."""
    _view: celtypes.MapType | None = None

    @property
    def name(self) -> str:
        return self.key[2]

    def view(self) -> celtypes.MapType:
        """The CEL variable `device` (built once per `allocate` call)."""
        if self._view is None:
            driver = self.key[0]
            attrs: dict[str, Json] = {}
            for name, value in (self.spec.get("attributes") or {}).items():
                domain, ident = _qualified(name, driver)
                converted = _cel_value(value) if isinstance(value, dict) else None
                if converted is not None:
                    attrs.setdefault(domain, {})[ident] = converted
            caps: dict[str, Json] = {}
            for (domain, ident), (_name, quantity) in self.capacity.items():
                caps.setdefault(domain, {})[ident] = quantity
            self._view = celtypes.MapType(
                {
                    celtypes.StringType("driver"): celtypes.StringType(driver),
                    celtypes.StringType("attributes"): _domains(attrs),
                    celtypes.StringType("capacity"): _domains(caps),
                    celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(self.multi),
                }
            )
        return self._view

    def attribute(self, qualified: str) -> tuple[str, Any] | None:
        """A constraint's attribute (`domain/name`) as (type, comparable value)."""
        wanted = _qualified(qualified, self.key[0])
        for name, value in (self.spec.get("attributes") or {}).items():
            if _qualified(name, self.key[0]) != wanted or not isinstance(value, dict):
                continue
            kind, raw = next(iter(value.items()))
            if kind == "version":
                with suppress(ValueError):
                    return kind, Version(str(raw))
            return kind, tuple(raw) if isinstance(raw, list) else raw
        return None


def _domains(entries: Mapping[str, Mapping[str, Any]]) -> _Domains:
    return _Domains(
        {
            celtypes.StringType(domain): celtypes.MapType(
                {celtypes.StringType(k): v for k, v in values.items()}
            )
            for domain, values in entries.items()
        }
    )


@dataclass(slots=True)
class _Offer:
    devices: list[_Device]
    by_key: dict[DeviceKey, _Device]
    counters: dict[CounterKey, Fraction]
    """Each shared counter's total."""
    invalid: dict[tuple[str, str], str] = field(default_factory=dict)
    """(driver, pool) -> why the scheduler refuses the whole pool."""


def _pool_key(spec: Json) -> tuple[tuple[str, str], int]:
    pool = spec.get("pool") or {}
    return (str(spec.get("driver", "")), str(pool.get("name", ""))), int(pool.get("generation", 0))


def _offer(slices: Sequence[Json], node: str | None) -> _Offer:
    """The devices the scheduler would consider for `node` (None: every node), in slice
    order: the newest generation of each complete pool."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key, generation = _pool_key(s.get("spec") or {})
        newest[key] = max(newest.get(key, generation), generation)
    current: dict[tuple[str, str], list[Json]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        key, generation = _pool_key(spec)
        if generation == newest[key]:
            current.setdefault(key, []).append(spec)
    devices: list[_Device] = []
    counters: dict[CounterKey, Fraction] = {}
    invalid: dict[tuple[str, str], str] = {}
    for (driver, pool), specs in current.items():
        expected = int((specs[0].get("pool") or {}).get("resourceSliceCount") or 1)
        if len(specs) < expected:
            continue  # incomplete: the scheduler waits for the rest of the pool
        here = node is None or any(s.get("nodeName") == node or s.get("allNodes") for s in specs)
        why = _invalid_pool(specs) if here else ""
        if why:
            invalid[(driver, pool)] = why
        for spec in specs:
            for counter_set in spec.get("sharedCounters") or ():
                for counter, value in (counter_set.get("counters") or {}).items():
                    counter_key = (driver, pool, str(counter_set["name"]), counter)
                    counters[counter_key] = Quantity.parse(value.get("value", 0)).value
            slice_node = spec.get("nodeName")
            if node is not None and slice_node != node and not spec.get("allNodes"):
                continue
            devices.extend(_device(driver, pool, slice_node, d) for d in spec.get("devices") or ())
    return _Offer(devices, {d.key: d for d in devices}, counters, invalid)


def _invalid_pool(specs: Sequence[Json]) -> str:
    """Why kube-scheduler refuses a pool outright ("" when it does not): a device consuming
    a counter its pool's counter sets do not define. It then allocates nothing on the node
    ("invalid resource pools were encountered"), not only nothing of that device, so a
    what-if that merely skipped the device would say claims fit that never get scheduled."""
    defined: dict[str, set[str]] = {}
    for spec in specs:
        for counter_set in spec.get("sharedCounters") or ():
            defined[str(counter_set["name"])] = set(counter_set.get("counters") or ())
    for spec in specs:
        for device in spec.get("devices") or ():
            for consumption in device.get("consumesCounters") or ():
                name = str(consumption.get("counterSet"))
                for counter in consumption.get("counters") or ():
                    if counter not in defined.get(name, ()):
                        return (
                            f"device {device.get('name')} consumes counter {counter} of counter "
                            f"set {name}, which the pool does not define"
                        )
    return ""


def _device(driver: str, pool: str, node: str | None, spec: Json) -> _Device:
    capacity = {
        _qualified(name, driver): (name, Quantity.parse(c.get("value", 0)))
        for name, c in (spec.get("capacity") or {}).items()
    }
    counters: dict[CounterKey, Fraction] = {}
    for consumption in spec.get("consumesCounters") or ():
        for counter, amount in (consumption.get("counters") or {}).items():
            key = (driver, pool, str(consumption["counterSet"]), counter)
            counters[key] = (
                counters.get(key, Fraction(0)) + Quantity.parse(amount.get("value", 0)).value
            )
    return _Device(
        key=(driver, pool, str(spec["name"])),
        spec=spec,
        node=node,
        multi=bool(spec.get("allowMultipleAllocations")),
        capacity=capacity,
        counters=counters,
    )


# -- requests --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Alternative:
    """One way to satisfy a request: the request itself or one of its subrequests."""

    request: str
    """The main request's name (what constraints name)."""
    result_name: str
    """What results carry: `main`, or `main/sub` for a subrequest."""
    class_name: str
    all_devices: bool
    count: int
    candidates: tuple[_Device, ...]
    """Devices that match the class and the selectors, tolerate the taints and have the
    asked capacities, in offer order; whether they are still free is the search's part."""
    capacity: Mapping[CapacityKey, Quantity]
    tolerations: tuple[Json, ...]
    admin: bool


def _tolerated(taint: Json, tolerations: Sequence[Json]) -> bool:
    """core/v1 toleration rules: an empty effect matches every effect; `Exists` with an
    empty key matches every key."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _blocking_taints(device: _Device, tolerations: Sequence[Json]) -> list[Json]:
    return [
        t
        for t in device.spec.get("taints") or ()
        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations)
    ]


def _taint_text(t: Json) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def _asked_key(device: _Device, key: CapacityKey) -> CapacityKey:
    return (key[0] or device.key[0], key[1])


def _lacking_capacity(device: _Device, asked: Mapping[CapacityKey, Quantity]) -> str:
    """Why `device` can never serve the ask ("" when it can): a capacity it lacks, or, for
    a device allocated whole, one smaller than asked."""
    for key, amount in asked.items():
        have = device.capacity.get(_asked_key(device, key))
        if have is None:
            return f"has no capacity {key[1]!r}"
        if not device.multi and have[1].value < amount.value:
            return f"has {have[0]} {have[1]}, asked {amount}"
    return ""


def _shown(items: Sequence[str]) -> str:
    more = len(items) - _SHOWN_REASONS
    return "; ".join(items[:_SHOWN_REASONS]) + (f"; and {more} more" if more > 0 else "")


class _Matcher:
    """Turns requests into alternatives with their candidate devices."""

    def __init__(self, offer: _Offer, classes: Mapping[str, Json]) -> None:
        self.offer = offer
        self.classes = classes
        self.cel = _Cel()

    def selectors(self, where: str, selectors: Sequence[Json]) -> list[celpy.Runner]:
        return [
            self.cel.program(str(s["cel"]["expression"]), where)
            for s in selectors
            if isinstance(s, dict) and "cel" in s
        ]

    def alternative(self, request: str, sub: str | None, body: Json) -> _Alternative | str:
        """The alternative with its candidates, or why it has none (text)."""
        result_name = request if sub is None else f"{request}/{sub}"
        where = f"request {result_name!r}"
        class_name = str(body.get("deviceClassName", ""))
        device_class = self.classes.get(class_name)
        if device_class is None:
            raise AllocationError(f"{where}: device class {class_name!r} not found")
        mode = body.get("allocationMode", "ExactCount")
        if mode not in ("ExactCount", "All"):
            raise AllocationError(f"{where}: unknown allocationMode {mode!r}")
        count = int(body.get("count", 1)) if mode == "ExactCount" else 0
        if mode == "ExactCount" and count < 1:
            raise AllocationError(f"{where}: count must be at least 1, got {count}")
        runners = self.selectors(
            f"device class {class_name!r}", (device_class.get("spec") or {}).get("selectors") or ()
        ) + self.selectors(where, body.get("selectors") or ())
        try:
            asked = {
                _qualified(name, ""): Quantity.parse(amount)
                for name, amount in ((body.get("capacity") or {}).get("requests") or {}).items()
            }
        except ValueError as exc:
            raise AllocationError(f"{where}: capacity requests: {exc}") from exc
        tolerations = tuple(body.get("tolerations") or ())
        matched: list[_Device] = []
        tainted: list[str] = []
        short: list[str] = []
        first_error = ""
        for device in self.offer.devices:
            verdict: bool | str = True
            for runner in runners:
                verdict = self.cel.matches(runner, device.view())
                if verdict is not True:
                    break
            if isinstance(verdict, str):
                first_error = first_error or f"{device.name}: {verdict}"
                continue
            if not verdict:
                continue
            lacking = _lacking_capacity(device, asked)
            if lacking:
                short.append(f"{device.name} {lacking}")
                continue
            blocking = _blocking_taints(device, tolerations)
            if blocking:
                tainted.append(f"{device.name} ({', '.join(map(_taint_text, blocking))})")
                continue
            matched.append(device)
        if not matched:
            if tainted or short:
                why = f"{where}: no usable device of device class {class_name!r}"
            else:
                why = f"{where}: no device matches device class {class_name!r} and the selectors"
            if tainted:
                why += f"; tainted and not tolerated: {_shown(tainted)}"
            if short:
                why += f"; too small: {_shown(short)}"
            if first_error:
                why += f"; CEL error: {first_error}"
            return why
        if count > len(matched):
            names = ", ".join(d.name for d in matched)
            return f"{where}: asks for {count} devices, only {len(matched)} match ({names})"
        return _Alternative(
            request=request,
            result_name=result_name,
            class_name=class_name,
            all_devices=mode == "All",
            count=count,
            candidates=tuple(matched),
            capacity=asked,
            tolerations=tolerations,
            admin=bool(body.get("adminAccess")),
        )


# -- consumable capacity ---------------------------------------------------------------------


def _policy_amount(policy: Json, asked: Quantity | None, total: Quantity) -> Quantity | str:
    """What one allocation consumes under `policy`: the ask (or the default) rounded up to
    a valid value; text when no valid value holds the ask."""
    want = asked or (Quantity.parse(policy["default"]) if "default" in policy else total)
    if policy.get("validValues"):
        valid = sorted((Quantity.parse(v) for v in policy["validValues"]), key=lambda q: q.value)
        for value in valid:
            if value.value >= want.value:
                return value
        return f"asks {want}, above every valid value ({', '.join(map(str, valid))})"
    valid_range = policy.get("validRange")
    if not valid_range:
        return want
    low = Quantity.parse(valid_range.get("min", 0))
    if want.value <= low.value:
        return low
    amount = want.value
    if valid_range.get("step"):
        step = Quantity.parse(valid_range["step"]).value
        amount = low.value + math.ceil((want.value - low.value) / step) * step
    if "max" in valid_range:
        high = Quantity.parse(valid_range["max"])
        if amount > high.value:
            return f"asks {want}, above the maximum {high}"
    return Quantity(amount, want.binary)


def _consumption(device: _Device, alt: _Alternative) -> dict[CapacityKey, Quantity] | str:
    """Every capacity of a multi-allocatable device with what this allocation takes: the
    ask, else the policy's default, else all of it; rounded up to a valid value."""
    asked = {_asked_key(device, k): v for k, v in alt.capacity.items()}
    published = device.spec.get("capacity") or {}
    out: dict[CapacityKey, Quantity] = {}
    for key, (name, total) in device.capacity.items():
        policy = (published.get(name) or {}).get("requestPolicy")
        amount = _policy_amount(policy, asked.get(key), total) if policy else asked.get(key, total)
        if isinstance(amount, str):
            return f"capacity {name}: {amount}"
        out[key] = amount
    return out


# -- the search ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pick:
    alt: _Alternative
    device: _Device
    consumed: dict[CapacityKey, Quantity] | None
    """For a multi-allocatable device: what this allocation takes of each capacity."""
    matched: list[tuple[int, Any]] = field(default_factory=list)
    distinct: list[tuple[int, Any]] = field(default_factory=list)


@dataclass(slots=True)
class _Held:
    """What other claims' allocations hold."""

    taken: set[DeviceKey] = field(default_factory=set)
    consumed: dict[DeviceKey, dict[CapacityKey, Fraction]] = field(default_factory=dict)
    counters: dict[CounterKey, Fraction] = field(default_factory=dict)
    counted: set[DeviceKey] = field(default_factory=set)
    """Devices whose counters are subtracted already (a device takes them once however
    many allocations share it)."""


def _held(offer: _Offer, in_use: Sequence[Json]) -> _Held:
    held = _Held()
    for allocation in in_use:
        for r in ((allocation or {}).get("devices") or {}).get("results") or ():
            if r.get("adminAccess"):
                continue  # admin access does not make a device unavailable
            key = (str(r["driver"]), str(r["pool"]), str(r["device"]))
            device = offer.by_key.get(key)
            if device is None:
                held.taken.add(key)
                continue
            if device.multi:
                used = held.consumed.setdefault(key, {})
                given = r.get("consumedCapacity")
                for ckey, (name, total) in device.capacity.items():
                    # no record of what it took: assume all of it, the safe side
                    amount = Quantity.parse(given[name]) if given and name in given else total
                    if given is not None and name not in given:
                        continue
                    used[ckey] = used.get(ckey, Fraction(0)) + amount.value
            else:
                held.taken.add(key)
            if key not in held.counted:
                held.counted.add(key)
                for counter_key, need in device.counters.items():
                    held.counters[counter_key] = held.counters.get(counter_key, Fraction(0)) + need
    return held


class _Search:
    """Depth-first over requests (in claim order), their alternatives (in order) and the
    candidates (in offer order); the first complete assignment wins."""

    def __init__(
        self,
        requests: Sequence[Sequence[_Alternative]],
        constraints: Sequence[Json],
        offer: _Offer,
        held: _Held,
    ) -> None:
        self.requests = requests
        self.constraints = constraints
        self.offer = offer
        self.held = held
        self.picks: list[_Pick] = []
        self.taken: set[DeviceKey] = set()
        self.consumed: dict[DeviceKey, dict[CapacityKey, Fraction]] = {}
        self.counters: dict[CounterKey, Fraction] = {}
        self.holders: dict[DeviceKey, int] = {}
        self.match_values: dict[int, tuple[Any, int]] = {}
        """constraint index -> (the value all must share, how many picks hold it)."""
        self.distinct_values: dict[int, list[Any]] = {}
        self.steps = 0
        self.failure: tuple[int, str] = (-1, "")
        self.solution: list[_Pick] = []

    def run(self) -> list[_Pick] | None:
        """The picks of the first complete assignment (the search unwinds after it)."""
        return self.solution if self._request(0) else None

    def _fail(self, why: str) -> None:
        """Keep the obstacle met deepest in the search: the most telling one."""
        if len(self.picks) > self.failure[0]:
            self.failure = (len(self.picks), why)

    def _request(self, index: int) -> bool:
        if index == len(self.requests):
            self.solution = list(self.picks)
            return True
        for alt in self.requests[index]:
            if alt.all_devices and self._all(alt, 0, index):
                return True
            if not alt.all_devices and self._exact(alt, alt.count, 0, index):
                return True
        return False

    def _all(self, alt: _Alternative, at: int, index: int) -> bool:
        if at == len(alt.candidates):
            return self._request(index + 1)
        device = alt.candidates[at]
        why = self._take(alt, device)
        if why:
            self._fail(f"request {alt.result_name!r} asks for all devices, {device.name} {why}")
            return False
        try:
            return self._all(alt, at + 1, index)
        finally:
            self._drop()

    def _exact(self, alt: _Alternative, left: int, start: int, index: int) -> bool:
        if left == 0:
            return self._request(index + 1)
        reasons: list[str] = []
        for at in range(start, len(alt.candidates) - left + 1):
            device = alt.candidates[at]
            why = self._take(alt, device)
            if why:
                reasons.append(f"{device.name} {why}")
                continue
            try:
                if self._exact(alt, left - 1, at + 1, index):
                    return True
            finally:
                self._drop()
        if reasons:
            self._fail(f"request {alt.result_name!r}: no device left: {_shown(reasons)}")
        return False

    def _take(self, alt: _Alternative, device: _Device) -> str:
        """Take `device` for `alt` and return "", or return why it cannot be taken."""
        self.steps += 1
        if self.steps > SEARCH_STEP_LIMIT:
            raise AllocationError(
                f"gave up after {SEARCH_STEP_LIMIT} tries; last obstacle: {self.failure[1]}"
            )
        key = device.key
        if not device.multi and not alt.admin:
            if key in self.held.taken:
                return "is allocated to another claim"
            if key in self.taken:
                return "is taken by another request of this claim"
        consumed = None
        if device.multi:
            wanted = _consumption(device, alt)
            if isinstance(wanted, str):
                return wanted
            short: list[str] = []
            for ckey, amount in wanted.items():
                name, total = device.capacity[ckey]
                left = total.value - self._used(key, ckey)
                if amount.value > left:
                    unit = amount.binary or total.binary
                    spare, whole = (
                        Quantity(max(left, Fraction(0)), unit),
                        Quantity(total.value, unit),
                    )
                    short.append(f"{name} (asks {amount}, {spare} of {whole} left)")
            if short:
                return f"has not enough left: {', '.join(short)}"
            consumed = wanted
        if key not in self.held.counted and not self.holders.get(key):
            for counter_key, need in device.counters.items():
                have = self.offer.counters.get(counter_key)
                remaining = (have or Fraction(0)) - self._counter_used(counter_key)
                if have is None or need > remaining:
                    where = f"{counter_key[2]}/{counter_key[3]}"
                    return f"needs {Quantity(need)} of counter {where}, {Quantity(remaining)} left"
        pick = _Pick(alt, device, consumed)
        why = self._constrain(pick)
        if why:
            return why
        self._apply(pick, 1)
        self.picks.append(pick)
        return ""

    def _used(self, key: DeviceKey, ckey: CapacityKey) -> Fraction:
        return self.held.consumed.get(key, {}).get(ckey, Fraction(0)) + self.consumed.get(
            key, {}
        ).get(ckey, Fraction(0))

    def _counter_used(self, ckey: CounterKey) -> Fraction:
        return self.held.counters.get(ckey, Fraction(0)) + self.counters.get(ckey, Fraction(0))

    def _constrain(self, pick: _Pick) -> str:
        for i, constraint in enumerate(self.constraints):
            names = constraint.get("requests") or ()
            if names and pick.alt.request not in names and pick.alt.result_name not in names:
                continue
            for kind in ("matchAttribute", "distinctAttribute"):
                attribute = constraint.get(kind)
                if not attribute:
                    continue
                value = pick.device.attribute(str(attribute))
                if value is None:
                    return f"has no attribute {attribute} ({kind})"
                if kind == "matchAttribute":
                    held = self.match_values.get(i)
                    if held is not None and held[0] != value:
                        return (
                            f"has {attribute}={_plain(value)} but the claim's other devices "
                            f"have {_plain(held[0])} (matchAttribute)"
                        )
                    pick.matched.append((i, value))
                else:
                    if value in self.distinct_values.get(i, ()):
                        return (
                            f"has {attribute}={_plain(value)} like another pick (distinctAttribute)"
                        )
                    pick.distinct.append((i, value))
        return ""

    def _apply(self, pick: _Pick, sign: int) -> None:
        device, key = pick.device, pick.device.key
        if not device.multi and not pick.alt.admin:
            if sign > 0:
                self.taken.add(key)
            else:
                self.taken.discard(key)
        if pick.consumed is not None:
            used = self.consumed.setdefault(key, {})
            for ckey, amount in pick.consumed.items():
                used[ckey] = used.get(ckey, Fraction(0)) + sign * amount.value
        holders = self.holders.get(key, 0) + sign
        self.holders[key] = holders
        first, last = sign > 0 and holders == 1, sign < 0 and holders == 0
        if key not in self.held.counted and (first or last):
            for counter_key, need in device.counters.items():
                self.counters[counter_key] = (
                    self.counters.get(counter_key, Fraction(0)) + sign * need
                )
        for i, value in pick.matched:
            count = self.match_values.get(i, (value, 0))[1] + sign
            if count:
                self.match_values[i] = (self.match_values.get(i, (value, 0))[0], count)
            else:
                del self.match_values[i]
        for i, value in pick.distinct:
            if sign > 0:
                self.distinct_values.setdefault(i, []).append(value)
            else:
                self.distinct_values[i].remove(value)

    def _drop(self) -> None:
        self._apply(self.picks.pop(), -1)


def _plain(value: tuple[str, Any]) -> str:
    raw = value[1]
    return raw.text if isinstance(raw, Version) else str(raw)


# -- the result ------------------------------------------------------------------------------


def _claim_label(claim: Json) -> str:
    meta = claim.get("metadata") or {}
    if meta.get("namespace"):
        return f"claim {meta['namespace']}/{meta.get('name', '?')}"
    return f"claim {meta.get('name', '?')}"


def _nodes_of(slices: Sequence[Json]) -> list[str]:
    out: list[str] = []
    for s in slices:
        node = (s.get("spec") or {}).get("nodeName")
        if node and node not in out:
            out.append(str(node))
    return out


def allocate(
    claim: Json,
    classes: Sequence[Json],
    slices: Sequence[Json],
    in_use: Sequence[Json] = (),
    *,
    node: str | None = None,
    share_id: Callable[[], str] = _new_share_id,
) -> Json:
    """The claim's `status.allocation`: `{"devices": {"results": [...], "config": [...]},
    "nodeSelector": ...}` (the node selector only for node-local devices).

    `classes` are DeviceClass objects, `slices` ResourceSlice objects, `in_use` the
    `status.allocation`s of every other allocated claim. `node` restricts the search to
    that node's slices (and `allNodes` ones); without it each node is tried in slice order,
    as the scheduler tries nodes. AllocationError says why nothing fits.
    """
    nodes = [node] if node is not None else _nodes_of(slices)
    if len(nodes) <= 1:
        return _allocate_on(claim, classes, slices, in_use, nodes[0] if nodes else None, share_id)
    failures: list[str] = []
    for candidate in nodes:
        try:
            return _allocate_on(claim, classes, slices, in_use, candidate, share_id)
        except AllocationError as exc:
            failures.append(f"node {candidate}: {exc}")
    raise AllocationError("; ".join(failures))


def _allocate_on(
    claim: Json,
    classes: Sequence[Json],
    slices: Sequence[Json],
    in_use: Sequence[Json],
    node: str | None,
    share_id: Callable[[], str],
) -> Json:
    label = _claim_label(claim)
    devices = (claim.get("spec") or {}).get("devices") or {}
    offer = _offer(slices, node)
    if offer.invalid:
        pools = "; ".join(f"pool {d}/{p}: {why}" for (d, p), why in sorted(offer.invalid.items()))
        raise AllocationError(f"{label}: invalid resource pools were encountered ({pools})")
    by_name = {str(c["metadata"]["name"]): c for c in classes}
    matcher = _Matcher(offer, by_name)
    requests: list[list[_Alternative]] = []
    try:
        for request in devices.get("requests") or ():
            name = str(request["name"])
            if "exactly" in request:
                options: list[tuple[str | None, Json]] = [(None, request["exactly"])]
            elif request.get("firstAvailable"):
                options = [(str(sub["name"]), sub) for sub in request["firstAvailable"]]
            else:
                raise AllocationError(f"request {name!r} has neither exactly nor firstAvailable")
            found = [matcher.alternative(name, sub, body) for sub, body in options]
            alternatives = [a for a in found if isinstance(a, _Alternative)]
            if not alternatives:
                raise AllocationError("; ".join(str(a) for a in found))
            requests.append(alternatives)
        search = _Search(requests, devices.get("constraints") or (), offer, _held(offer, in_use))
        picks = search.run()
    except AllocationError as exc:
        raise AllocationError(f"{label}: {exc}") from None
    if picks is None:
        raise AllocationError(f"{label}: {search.failure[1] or 'the constraints cannot all hold'}")
    allocation: Json = {"devices": {"results": [_result(p, share_id) for p in picks]}}
    configs = _configs(picks, by_name, devices.get("config") or ())
    if configs:  # as kube-scheduler 1.36 writes it: no `config` key when there is none
        allocation["devices"]["config"] = configs
    local = sorted({p.device.node for p in picks if p.device.node})
    if local:
        allocation["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": local}]}
            ]
        }
    return allocation


def _result(pick: _Pick, share_id: Callable[[], str]) -> Json:
    driver, pool, device = pick.device.key
    out: Json = {"request": pick.alt.result_name, "driver": driver, "pool": pool, "device": device}
    if pick.alt.admin:
        out["adminAccess"] = True
    if pick.alt.tolerations:
        out["tolerations"] = [dict(t) for t in pick.alt.tolerations]
    if pick.consumed is not None:
        out["shareID"] = share_id()
        out["consumedCapacity"] = {
            name: str(pick.consumed[ckey]) for ckey, (name, _) in pick.device.capacity.items()
        }
    return out


def _configs(
    picks: Sequence[_Pick], classes: Mapping[str, Json], claim: Sequence[Json]
) -> list[Json]:
    """Class configs (one entry per allocated request and class config, naming that
    request), then the claim's own, in that order: drivers let later entries win."""
    out: list[Json] = []
    seen: set[str] = set()
    for pick in picks:
        alt = pick.alt
        if alt.result_name in seen:
            continue
        seen.add(alt.result_name)
        for entry in (classes[alt.class_name].get("spec") or {}).get("config") or ():
            body = {k: v for k, v in entry.items() if k not in ("source", "requests")}
            out.append({"source": "FromClass", "requests": [alt.result_name], **body})
    for entry in claim:
        body = {k: v for k, v in entry.items() if k != "requests"}
        copied: Json = {"source": "FromClaim"}
        if entry.get("requests"):
            copied["requests"] = list(entry["requests"])
        out.append(copied | body)
    return out
