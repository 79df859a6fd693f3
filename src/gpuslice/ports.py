"""The small interfaces the adapters implement and the agent composes.

The core never imports these adapters; it receives plain data (`Inventory`, events,
samples). Each Protocol here has a real implementation and a fake shipped beside it
(`backends.simulated`, `emulator`, a fake MPS control program), so tests and the demo
exercise the same code paths as production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from gpuslice.core.caps import MemoryLimits
from gpuslice.core.devices import Inventory, MigDevice
from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.dra.resource_slice import StoredSlice
from gpuslice.core.health import HealthEvent
from gpuslice.core.jsontypes import Json


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process with a context on a GPU (or on one MIG device of it)."""

    pid: int
    """Host PID: NVML is not PID-namespace aware."""
    gpu_uuid: str
    used_memory_bytes: int | None
    mig_uuid: str | None = None
    sm_util_percent: int | None = None
    """Recent SM utilisation sample where NVML gives one (not on MIG)."""
    is_mps_client: bool = False


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """Device-level telemetry for one GPU, read in one pass for the metrics snapshot."""

    gpu_uuid: str
    memory_used_mib: int | None
    """None where NVML reports no memory figures (a unified-memory GPU, `Gpu.memory_reported`)."""
    memory_free_mib: int | None
    gpu_util_percent: int | None
    memory_util_percent: int | None
    temperature_c: int | None
    power_w: float | None
    last_xid: int | None = None


class GpuBackend(Protocol):
    """A source of GPU facts. Calls may block (NVML does): the agent runs them off the loop."""

    @property
    def name(self) -> str:
        """`nvml` or `simulated`, for logs and `describe`."""
        ...

    def inventory(self) -> Inventory: ...

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to `timeout_s` for the next health event; None on timeout."""
        ...

    def processes(self) -> tuple[GpuProcess, ...]: ...

    def statuses(self) -> tuple[GpuStatus, ...]: ...

    def close(self) -> None: ...


class BackendError(Exception):
    """A backend could not start or answer (no driver, no library, bad simulated spec)."""


@runtime_checkable
class MigPartitioner(Protocol):
    """Creates and destroys MIG devices one at a time, for dynamic MIG (`agent.dynamic_mig`).

    Both backends implement it: NVML through its GPU- and compute-instance calls, the
    simulator on its tables, with the driver's rules. Neither ever changes a GPU's MIG mode:
    on a GPU not in MIG mode both refuse. Calls block (NVML does); the agent runs them off
    the loop.
    """

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigDevice:
        """A GPU instance of `profile` at placement `start` and one compute instance
        spanning it: the new MIG device as the inventory will list it. BackendError (the
        GPU's state unchanged) when the driver refuses: MIG mode off, no such profile or
        placement, the placement taken, no compute slices left."""
        ...

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str, gi_id: int, ci_id: int) -> None:
        """Destroy compute instance `ci_id` and GPU instance `gi_id`, after checking that
        the MIG device there is still `mig_uuid`: one that is gone raises MigGone; one with
        another UUID is someone else's (MigNotOurs) and is left alone."""
        ...

    def live_mig_devices(self, gpu_uuid: str) -> tuple[MigDevice, ...]:
        """The GPU's MIG devices now, read again (not the last inventory's)."""
        ...


class MigGone(BackendError):
    """The MIG device to destroy no longer exists."""


class MigNotOurs(BackendError):
    """The GI/CI ids hold an instance with another UUID than the one recorded."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Which device IDs of one resource a container holds, as the kubelet's PodResources says."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodAssignments(Protocol):
    """Who holds which advertised device: the PodResources client, or the emulator's books."""

    async def list_assignments(self) -> tuple[ContainerDevices, ...]: ...


class ClaimPreparer(Protocol):
    """Prepares and unprepares ResourceClaims for the DRA gRPC server (`gpuslice.dra`).

    Both answer per claim UID. A claim missing from the answer is reported by the server as
    that claim's error; an exception fails every claim of the batch (each gets the error),
    never the call. Both must be idempotent: the kubelet re-sends after its own restart.
    """

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Claim UID -> error text; "" means unprepared (or was never prepared)."""
        ...


class DraObjectNotFound(LookupError):
    """The API has no such object (HTTP 404): a claim deleted or replaced meanwhile."""


class DraObjects(Protocol):
    """The `resource.k8s.io/v1` objects a DRA driver reads and writes, as the API's JSON.

    `k8s.dra.DraApi` talks to the API server; `emulator.dra_store.DraStore` keeps them in
    memory for the demo. Slices are this node's slices of this driver only.
    """

    async def get_claim(self, namespace: str, name: str) -> Json:
        """The ResourceClaim; DraObjectNotFound when there is none."""
        ...

    async def list_claims(self, uids: Collection[str] | None = None) -> list[Json]:
        """The ResourceClaims whose UID is in `uids` (every one when None), to rebuild a lost
        record: only at start, only after the record was lost. Read from the cluster-wide
        list page by page, holding only the claims kept: a cluster of many claims must not
        exhaust the agent's memory in the middle of a rebuild."""
        ...

    async def node_uid(self) -> str:
        """The Node's UID (slices are owned by it); "" when unknown."""
        ...

    async def list_slices(self) -> list[Json]: ...

    async def listed_slices(self) -> SliceListing:
        """The slices and the resourceVersion of the list, to watch from."""
        ...

    def watch_slices(self, resource_version: str) -> AsyncIterator[SliceEvent]:
        """The slices' changes after `resource_version`, as the API's watch gives them
        (with bookmarks, so an idle watch still moves its version on); the stream
        re-establishes itself when the server ends it. DraExpired when the version left the
        server's history (410 Gone): list again."""
        ...

    async def create_slice(self, obj: Json) -> Json: ...

    async def replace_slice(self, obj: Json) -> Json:
        """Replace guarded by `metadata.resourceVersion`; DraConflict when it moved."""
        ...

    async def delete_slice(self, name: str) -> None:
        """DraObjectNotFound when it was already gone."""
        ...


@dataclass(frozen=True, slots=True)
class SliceListing:
    items: list[Json]
    resource_version: str


@dataclass(frozen=True, slots=True)
class SliceEvent:
    """One watch event: ADDED, MODIFIED, DELETED (`obj` the slice) or BOOKMARK (`obj` holds
    only `metadata.resourceVersion`)."""

    kind: str
    obj: Json

    @property
    def resource_version(self) -> str:
        return StoredSlice.read(self.obj).resource_version


class DraExpired(Exception):
    """A watch asked for a resourceVersion the server no longer holds (410 Gone), or one
    its watch cache has not reached ("Too large resource version"): list again."""


class DraConflict(Exception):
    """A write lost a race (HTTP 409): re-read and plan again."""


class MemoryLimitsError(Exception):
    """Setting or reading a cgroup's memory limits failed. `refusal` says why in the words
    of `core.caps.Refusal` (`driver-without-call`, `mig`, `nvml-error`), or `gone` for a
    cgroup that no longer exists (its container ended: nothing to cap)."""

    def __init__(self, refusal: str, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


class MemoryLimiter(Protocol):
    """Per-cgroup GPU memory limits (`nvmlDeviceSetMemoryLimits_v1` and its getter): the
    NVML backend's, or the simulator's. Calls may block (NVML does)."""

    def memory_limits_supported(self) -> bool:
        """Whether the driver has the calls at all (r615+); asked once at start."""
        ...

    def set_memory_limits(self, gpu_uuid: str, cgroup_path: str, limits: MemoryLimits) -> None:
        """Set `limits` (soft and hard) for the cgroup at `cgroup_path` (its full sysfs
        path) on the GPU; `core.caps.CLEARED` clears them. MemoryLimitsError on failure."""
        ...

    def get_memory_limits(self, gpu_uuid: str, cgroup_path: str) -> MemoryLimits:
        """The cgroup's limits on the GPU and the memory it uses there (`used_bytes`)."""
        ...


ComputeMode = Literal["DEFAULT", "EXCLUSIVE_PROCESS"]


class ComputeModeSetter(Protocol):
    """Sets a GPU's compute mode around its MPS daemon (`nvsmi.NvidiaSmi`)."""

    async def set_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        """Set the mode; `aio.programs.ProgramError` (`MpsError`) carrying the tool's own
        message when that fails."""
        ...


class TimesliceSetter(Protocol):
    """Sets a GPU's time-slice interval for a DRA claim (`nvsmi.NvidiaSmi`)."""

    async def set_timeslice(self, gpu_uuid: str, interval: int) -> None:
        """Set the interval (0-3); `ProgramError` (`MpsError`) carrying the tool's message
        when that fails."""
        ...
