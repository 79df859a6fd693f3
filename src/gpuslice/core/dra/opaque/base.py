"""What every opaque config kind is made of, and what it contributes to.

Below the kind modules and `core.dra.sharing`, so a kind imports nothing but this (and
its API group's shared pieces), and the resolution walk imports the kinds through the
registry only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict

from gpuslice.core.errors import GpusliceError
from gpuslice.core.sharing.model import NvidiaSharingName, SharingStrategy

DeviceKind = Literal["gpu", "mig"]
INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


class ClaimConfigError(GpusliceError):
    """A claim's config cannot be used; the message names the config entry and field."""


class StrictModel(BaseModel):
    """JSON's field names only (`mpsConfig`, never `mps_config`), as NVIDIA's strict decoder
    reads them: a name it refuses as unknown is refused here too."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def json_number(value: object) -> object:
    """A JSON number, as the API server's admission policy sees it: a string or a boolean is
    not one (pydantic would read "50" and true as numbers; NVIDIA's decoder and CEL do not),
    and a float with no fraction (`50.0`, `5e1`) is the integer the API server makes of it."""
    if isinstance(value, bool | str):
        raise ValueError("must be a number, not a string or a boolean")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _json_quantity(value: object) -> object:
    """A quantity: a string, or a JSON number as `json_number` reads it."""
    return value if isinstance(value, str) else json_number(value)


JsonInt = Annotated[int, BeforeValidator(json_number)]
JsonQuantity = Annotated[str | int, BeforeValidator(_json_quantity)]


# -- what the driver acts on ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MpsSettings:
    active_thread_percentage: int | None = None
    pinned_limit_mib: int | None = None
    per_device_limit_mib: Mapping[str, int] = field(default_factory=dict)
    """Key: a device UUID, or an index into the group's devices (as a string)."""
    multi_user: bool = False

    def limit_for(self, uuid: str, index: int) -> int | None:
        for key in (uuid, str(index)):
            if key in self.per_device_limit_mib:
                return self.per_device_limit_mib[key]
        return self.pinned_limit_mib


@dataclass(frozen=True, slots=True)
class SharingSlot:
    """The `sharing` slot (NVIDIA's `GpuConfig`, `MigDeviceConfig`): how the devices are
    shared between the claim's pods, time-sliced or by MPS."""

    strategy: SharingStrategy = SharingStrategy.NONE
    """NONE: no sharing asked (the default config): the devices are the claim's alone,
    shared only by the pods and containers that reference the claim."""
    interval: int | None = None
    """Time-slice interval (0-3) when the claim asked for one; None: leave the GPU as is."""
    mps: MpsSettings | None = None
    source: str = "default"
    """Which config entry this came from, for messages (`config[2]` or `default`)."""


@dataclass(frozen=True, slots=True)
class GuardSlot:
    """The `guard` slot (gpuslice's `GuardConfig`): the memory guard for the claim's pods."""

    mode: str | None = None
    shared_by: int | None = None
    """`sharedBy`: pods meant to share each device (None: not said, 1)."""


R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Slot(Generic[R]):
    """One aspect of a device that kinds configure: its name (a field of `Sharing`) and
    the record a kind of that slot returns, so a kind can set its own slot's fields and no
    other's (GuardConfig once reset a sharing kind's `shared_by`)."""

    name: str
    record: type[R]


SHARING = Slot("sharing", SharingSlot)
GUARD = Slot("guard", GuardSlot)
SLOTS: tuple[Slot[Any], ...] = (SHARING, GUARD)
"""Every slot, each a field of `Sharing`. A new aspect of a device is a record above, a
field below and an entry here, and the step that acts on it in `core.dra.preparation`."""


@dataclass(frozen=True, slots=True)
class Sharing:
    """One device's resolved configs, one record per slot: applied once to the group of
    devices that share it. The properties read the records for the code that acts on them."""

    kind: DeviceKind
    sharing: SharingSlot = SharingSlot()
    guard: GuardSlot = GuardSlot()

    @property
    def strategy(self) -> NvidiaSharingName | None:
        """As NVIDIA's config spells it; None: no sharing asked."""
        shares = self.sharing.strategy
        return None if shares is SharingStrategy.NONE else shares.nvidia_name

    @property
    def interval(self) -> int | None:
        return self.sharing.interval

    @property
    def mps(self) -> MpsSettings | None:
        return self.sharing.mps

    @property
    def source(self) -> str:
        """The sharing config's entry, which messages name."""
        return self.sharing.source

    @property
    def guard_mode(self) -> str | None:
        return self.guard.mode

    @property
    def shared_by(self) -> int | None:
        return self.guard.shared_by

    @property
    def shares(self) -> SharingStrategy:
        """How the devices are shared (`NONE` when no sharing was asked)."""
        return self.sharing.strategy


@dataclass(frozen=True, slots=True)
class Rule:
    """One validation in the chart's claim-config admission policy: CEL the API server runs
    on every ResourceClaim and template (`variables.at` is where their configs are)."""

    expression: str
    message_expression: str
    """CEL: the refusal, naming the field and, where it can, the value."""
    message: str | None = None
    """The refusal where `message_expression` cannot be evaluated."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission must check that a kind's model cannot tell the generator
    (`core.dra.opaque.admission`): nested blocks and rules across fields, as CEL. The
    generator derives the rest (each scalar field's type, enum and range; the fields a kind
    has); kinds that share one (NVIDIA's two sharing kinds) share the object, emitted once."""

    name: str
    covers: frozenset[str]
    """The kind's fields (JSON names) these rules check, which the generator leaves alone."""
    variables: tuple[tuple[str, str], ...] = ()
    """CEL variables the rules read (`variables.known`: the configs of a registered kind;
    `variables.of<Kind>`: one kind's)."""
    rules: tuple[Rule, ...] = ()


M = TypeVar("M", bound=StrictModel)


def _no_check(parsed: Any, where: str) -> None:
    """Most kinds need nothing past their model's own validation."""


@dataclass(frozen=True)
class OpaqueKind(Generic[M, R]):
    """One opaque config kind, as `core.dra.sharing.resolve` uses it."""

    api_version: str
    kind: str
    model: type[M]
    """Strict: an unknown field is an error naming it."""
    slot: Slot[R]
    """The aspect of a device the kind configures (`SHARING`, `GUARD`): each device gets
    at most one config per slot, the highest in NVIDIA's precedence that applies to it."""
    fits: frozenset[DeviceKind]
    """The devices it may configure. A config naming a request whose device it does not fit
    is an error (NVIDIA's rule: no `GpuConfig` on a MIG device); one naming no request
    passes such devices by."""
    contribute: Callable[[M, str], R]
    """The slot's record for this config, whole (a slot's fields come from one config);
    `str` is the entry (`config[2]`), for messages."""
    check: Callable[[M, str], None] = _no_check
    """Rules across fields that the model cannot say; ClaimConfigError naming `where`."""
    admission: Admission | None = None
    """The same checks for the chart's admission policy, where the model's fields are not
    scalars the generator can read (`Admission`); None: the model says everything."""
