"""The `version: v1` config file, as pydantic models with NVIDIA's key spelling.

Field names are snake_case in Python and camelCase (NVIDIA's JSON names) in files and dumps,
so `model_dump(by_alias=True)` is the document NVIDIA's plugin logs as "Running with config".
Validation is stricter than NVIDIA's on purpose: NVIDIA ignores unknown keys and silently
picks MPS over time-slicing, which turns typos into configs that load but do nothing.
Checks that need the node's GPUs (does device 3 exist?) are the plan's, not the schema's.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    model_serializer,
    model_validator,
)

from gpuslice.core.config.fields import (
    DeviceSelection,
    config_error,
    describe_selection,
    device_selection,
    format_go_duration,
    resource_name,
    selections_overlap,
    show,
    sleep_interval,
)
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import (
    AllocationPolicy,
    DeviceIdStrategy,
    DeviceListStrategy,
    MigStrategy,
)

VERSION = "v1"
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
"""What NVIDIA's Helm chart passes as MPS_ROOT; used when the config leaves mpsRoot empty."""

MAX_REPLICAS = 4096
"""Each replica is one device in every ListAndWatch update; a typo such as `replicas: 1000000`
would otherwise make the plugin build and stream millions of devices."""

DeviceDiscoveryStrategy = Literal["auto", "nvml", "tegra"]
"""What NVIDIA's device plugin accepts (`cmd/nvidia-device-plugin/main.go`). GFD alone also
takes `vfio`; gpuslice is the plugin, so `vfio` is refused with that reason."""

ResourceNameField = Annotated[StrictStr, AfterValidator(resource_name)]
Devices = Annotated[DeviceSelection, BeforeValidator(device_selection)]
SleepInterval = Annotated[
    float,
    BeforeValidator(sleep_interval),
    PlainSerializer(format_go_duration, return_type=str),
]


def _known_version(value: str) -> str:
    if value != VERSION:
        raise config_error(
            f"unknown version: {show(value)}; the only supported version is '{VERSION}'"
        )
    return value


def _string_list(value: object) -> object:
    """`deviceListStrategy` may be one string or a list (NVIDIA's custom unmarshaller)."""
    if isinstance(value, list | tuple) and not value:
        raise config_error("must name at least one strategy")
    return (value,) if isinstance(value, str) else value


def _non_empty_resources(value: object) -> object:
    """Checked before the items, so an empty list is not confused with invalid items."""
    if isinstance(value, list | tuple) and not value:
        raise config_error("no resources specified (the list is empty)")
    return value


def _plugin_discovery(value: object) -> object:
    if value == "vfio":
        raise config_error(
            "invalid --device-discovery-strategy option: 'vfio' is accepted by GPU Feature "
            "Discovery only, not by the device plugin; use 'auto', 'nvml' or 'tegra'"
        )
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: SerializerFunctionWrapHandler) -> Json:
        """Leave out fields that are None, as Go's `omitempty` pointers do in NVIDIA's dump, and
        give lists rather than tuples, so the dump goes straight into `yaml.safe_dump`."""
        data: Json = handler(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items() if v is not None}


class PluginFlags(_Model):
    pass_device_specs: StrictBool = Field(default=False, alias="passDeviceSpecs")
    device_list_strategy: Annotated[
        tuple[DeviceListStrategy, ...], BeforeValidator(_string_list)
    ] = Field(default=("envvar",), alias="deviceListStrategy")
    device_id_strategy: DeviceIdStrategy = Field(default="uuid", alias="deviceIDStrategy")
    cdi_annotation_prefix: StrictStr = Field(default="cdi.k8s.io/", alias="cdiAnnotationPrefix")
    nvidia_ctk_path: StrictStr = Field(default="/usr/bin/nvidia-ctk", alias="nvidiaCTKPath")
    container_driver_root: StrictStr = Field(default="/driver-root", alias="containerDriverRoot")
    shared_devices_allocation_policy: AllocationPolicy = Field(
        default="distributed", alias="sharedDevicesAllocationPolicy"
    )


class GfdFlags(_Model):
    oneshot: StrictBool = Field(default=False, alias="oneshot")
    no_timestamp: StrictBool = Field(default=False, alias="noTimestamp")
    sleep_interval: SleepInterval = Field(default=60.0, alias="sleepInterval")
    """Seconds between label refreshes; `math.inf` for `infinite`."""
    output_file: StrictStr = Field(
        default="/etc/kubernetes/node-feature-discovery/features.d/gfd", alias="outputFile"
    )
    machine_type_file: StrictStr = Field(
        default="/sys/class/dmi/id/product_name", alias="machineTypeFile"
    )


class DynamicMigFlags(_Model):
    """gpuslice's extension (docs/dra.md, dynamic MIG): which GPUs publish MIG partitions for
    the scheduler to choose from, instead of the instances they hold. DRA mode only."""

    devices: Devices = Field(default="all", alias="devices")
    """`all`, a count (the first N GPUs by index), or GPU indices / UUIDs; a GPU not
    selected stays static."""

    @model_validator(mode="after")
    def _gpus_only(self) -> DynamicMigFlags:
        if isinstance(self.devices, tuple):
            mig = [d for d in self.devices if ":" in d or d.startswith("MIG-")]
            if mig:
                raise config_error(
                    f"devices: {', '.join(mig)} name MIG devices; dynamic MIG selects whole "
                    "GPUs (an index or a GPU UUID), whose MIG devices it then makes"
                )
        return self

    def markers(self) -> tuple[str, ...]:
        """What `core.dra.partitions.is_dynamic` reads: `all`, or GPU indices and UUIDs."""
        if self.devices == "all":
            return ("all",)
        if isinstance(self.devices, int):
            return tuple(str(i) for i in range(self.devices))
        return tuple(self.devices)


class Flags(_Model):
    mig_strategy: MigStrategy = Field(default="none", alias="migStrategy")
    dynamic_mig: DynamicMigFlags | None = Field(default=None, alias="dynamicMig")
    """gpuslice's extension: GPUs in dynamic MIG (DRA mode); None: every GPU is static."""
    fail_on_init_error: StrictBool = Field(default=True, alias="failOnInitError")
    mps_root: StrictStr = Field(default="", alias="mpsRoot")
    """Empty means the Helm chart's `/run/nvidia/mps` (see `effective_mps_root`)."""
    nvidia_driver_root: StrictStr = Field(default="/", alias="nvidiaDriverRoot")
    nvidia_dev_root: StrictStr = Field(default="", alias="nvidiaDevRoot")
    """Empty means the driver root, as NVIDIA resolves it."""
    gdrcopy_enabled: StrictBool = Field(default=False, alias="gdrcopyEnabled")
    gds_enabled: StrictBool = Field(default=False, alias="gdsEnabled")
    mofed_enabled: StrictBool = Field(default=False, alias="mofedEnabled")
    use_node_feature_api: StrictBool | None = Field(default=None, alias="useNodeFeatureAPI")
    device_discovery_strategy: Annotated[
        DeviceDiscoveryStrategy, BeforeValidator(_plugin_discovery)
    ] = Field(default="auto", alias="deviceDiscoveryStrategy")
    plugin: PluginFlags = Field(default_factory=PluginFlags, alias="plugin")
    gfd: GfdFlags = Field(default_factory=GfdFlags, alias="gfd")

    @property
    def effective_dev_root(self) -> str:
        return self.nvidia_dev_root or self.nvidia_driver_root

    @property
    def effective_mps_root(self) -> str:
        return self.mps_root or DEFAULT_MPS_ROOT


class ResourcePattern(_Model):
    pattern: StrictStr = Field(alias="pattern", min_length=1)
    """Anchored glob matched against the GPU product name or the MIG profile; `*` = any run."""
    name: ResourceNameField = Field(alias="name")


class Resources(_Model):
    """User naming rules. An empty list means NVIDIA's built-in rules for the MIG strategy."""

    gpus: tuple[ResourcePattern, ...] = Field(default=(), alias="gpus")
    mig: tuple[ResourcePattern, ...] = Field(default=(), alias="mig")


class ReplicatedResource(_Model):
    name: ResourceNameField = Field(alias="name")
    rename: ResourceNameField | None = Field(default=None, alias="rename")
    replicas: StrictInt = Field(alias="replicas", ge=1, le=MAX_REPLICAS)
    """Advertised devices per selected physical device; 1 means not shared."""
    devices: Devices = Field(default="all", alias="devices")


class ReplicatedResources(_Model):
    rename_by_default: StrictBool = Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: StrictBool = Field(
        default=False, alias="failRequestsGreaterThanOne"
    )
    resources: Annotated[tuple[ReplicatedResource, ...], BeforeValidator(_non_empty_resources)] = (
        Field(alias="resources")
    )

    @model_validator(mode="after")
    def _no_overlapping_entries(self) -> Self:
        """Entries for one resource may split its devices (per-GPU sharing), never share one."""
        for j, later in enumerate(self.resources):
            for i, earlier in enumerate(self.resources[:j]):
                if later.name == earlier.name and selections_overlap(
                    earlier.devices, later.devices
                ):
                    first = describe_selection(earlier.devices)
                    second = describe_selection(later.devices)
                    raise config_error(
                        f"resource '{later.name}' is listed in both resources[{i}] and "
                        f"resources[{j}] with overlapping devices ({first} and {second}); list "
                        "it once, or give each entry a disjoint 'devices' selection",
                        subpath=f"resources[{j}]",
                    )
        return self


class Sharing(_Model):
    time_slicing: ReplicatedResources | None = Field(default=None, alias="timeSlicing")
    mps: ReplicatedResources | None = Field(default=None, alias="mps")

    @model_validator(mode="before")
    @classmethod
    def _mps_fails_multi_requests_by_default(cls, data: object) -> object:
        """NVIDIA v0.20: an MPS block without failRequestsGreaterThanOne means true."""
        if isinstance(data, dict) and isinstance(data.get("mps"), dict):
            mps = data["mps"]
            if "failRequestsGreaterThanOne" not in mps:
                data = {**data, "mps": {**mps, "failRequestsGreaterThanOne": True}}
        return data

    @model_validator(mode="after")
    def _one_strategy_per_resource(self) -> Self:
        if self.time_slicing is None or self.mps is None:
            return self
        for j, entry in enumerate(self.mps.resources):
            for i, other in enumerate(self.time_slicing.resources):
                if entry.name == other.name:
                    raise config_error(
                        f"resource '{entry.name}' is shared with both time-slicing "
                        f"(sharing.timeSlicing.resources[{i}]) and MPS; a resource uses one "
                        "sharing strategy: remove it from one of the two blocks",
                        subpath=f"mps.resources[{j}].name",
                    )
        return self


class Imex(_Model):
    channel_ids: tuple[StrictInt, ...] = Field(default=(), alias="channelIDs")
    required: StrictBool = Field(default=False, alias="required")

    @model_validator(mode="after")
    def _channels(self) -> Self:
        if self.channel_ids not in ((), (0,)):
            raise config_error(
                "invalid IMEX config: channelIDs must be [] or [0]; "
                f"found {list(self.channel_ids)}",
                subpath="channelIDs",
            )
        return self


class Config(_Model):
    """A whole config file. Build it with `parse_config`, never from unchecked data."""

    version: Annotated[StrictStr, AfterValidator(_known_version)] = Field(
        default=VERSION, alias="version"
    )
    flags: Flags = Field(default_factory=Flags, alias="flags")
    resources: Resources = Field(default_factory=Resources, alias="resources")
    sharing: Sharing = Field(default_factory=Sharing, alias="sharing")
    imex: Imex = Field(default_factory=Imex, alias="imex")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.sharing.mps is not None and self.flags.mig_strategy == "mixed":
            raise config_error(
                "using migStrategy 'mixed' is not supported with MPS (sharing.mps): MPS shares "
                "whole GPUs only; use migStrategy 'none', or time-slicing for MIG resources",
                subpath="flags.migStrategy",
            )
        return self
