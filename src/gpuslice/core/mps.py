"""What each MPS control daemon must look like, computed from the sharing plan.

NVIDIA runs one `nvidia-cuda-mps-control` per replicated resource and configures it with
daemon-wide defaults (a pinned-memory limit per GPU index and one active-thread percentage).
Keeping that derivation pure means the paths the daemon uses and the paths Allocate mounts
into containers come from the same functions, and the limits can be checked without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuslice.core.devices import GpuUuid
from gpuslice.core.sharing.model import (
    MpsShare,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)

DEFAULT_MPS_ROOT = "/run/nvidia/mps"
"""`flags.mpsRoot` when the config leaves it empty (NVIDIA's Helm default)."""

STARTED_MARKER = ".started"
READY_MARKER = ".ready"


def mps_root(root: str) -> str:
    """`flags.mpsRoot` with NVIDIA's default applied; trailing slashes dropped."""
    return (root or DEFAULT_MPS_ROOT).rstrip("/") or "/"


def resource_dir(root: str, resource: str) -> str:
    """`<root>/<resource>`: the full name keeps its slash, e.g. `/run/nvidia/mps/nvidia.com/gpu`."""
    return f"{mps_root(root).rstrip('/')}/{resource}"


def pipe_dir(root: str, resource: str) -> str:
    """The daemon's `CUDA_MPS_PIPE_DIRECTORY` on the host; Allocate mounts it into containers."""
    return f"{resource_dir(root, resource)}/pipe"


def log_dir(root: str, resource: str) -> str:
    return f"{resource_dir(root, resource)}/log"


def shm_dir(root: str) -> str:
    """Shared by every resource: the clients' `/dev/shm` (page-locked host memory lives there)."""
    return f"{mps_root(root).rstrip('/')}/shm"


def ready_marker(root: str) -> str:
    """`<root>/.ready`: present while every MPS daemon of the node answers."""
    return f"{mps_root(root).rstrip('/')}/{READY_MARKER}"


CONTROL_SOCKET = "control"
"""The unix socket the control daemon listens on, in its pipe directory."""
MAX_SOCKET_PATH_BYTES = 107
"""`sun_path` holds 108 bytes including the terminating NUL."""


def control_socket_too_long(pipe_dir: str) -> str | None:
    """Why a daemon in `pipe_dir` could not listen, when its control socket's path is longer
    than a unix socket's may be (None when it fits). The control program then only exits
    with status 1; said before starting it, the claim fails at once with the path named
    instead of after the readiness timeout. A DRA claim's pipe directory is
    `<--dra-plugin-dir>/mps/<claim UID>-<5 hex>/pipe`: the plugin directory may have at most
    47 bytes (the kubelet's default, `/var/lib/kubelet/plugins/gpu.nvidia.com`, has 39)."""
    path = f"{pipe_dir.rstrip('/')}/{CONTROL_SOCKET}"
    size = len(path.encode())
    if size <= MAX_SOCKET_PATH_BYTES:
        return None
    return (
        f"MPS control socket {path!r} is {size} bytes, longer than the "
        f"{MAX_SOCKET_PATH_BYTES} a unix socket path may have: the MPS daemon could not "
        "listen on it (shorten the MPS root: --dra-plugin-dir in DRA mode, --mps-root)"
    )


@dataclass(frozen=True, slots=True)
class MpsDaemonSpec:
    """One control daemon: where it lives and what it is told after it starts.

    Two specs that compare equal describe the same running daemon; any difference (a GPU
    more, another limit) means the daemon must be restarted, because a running MPS server
    does not pick up new defaults.
    """

    resource: ResourceName
    root: str
    """The MPS root with the default applied (`/run/nvidia/mps`)."""
    pipe_dir: str
    log_dir: str
    shm_dir: str
    started_marker: str
    ready_marker: str
    gpu_uuids: tuple[GpuUuid, ...]
    gpu_indices: tuple[int, ...]
    """Same order as `gpu_uuids`."""
    active_thread_percentage: int
    pinned_mem_limits_mib: tuple[tuple[int, int], ...]
    """(device index, MiB) pairs. Indices, not UUIDs: limits set by UUID did not take
    effect. The GPU's index for a whole-GPU daemon; for a MIG daemon the MIG device's
    position in `mig_uuids`, which is how the daemon, seeing only those, numbers them."""
    mig_uuids: tuple[str, ...] = ()
    """The MIG devices a DRA claim's daemon serves (NVIDIA's driver runs MPS on MIG
    devices this way): its `CUDA_VISIBLE_DEVICES`, so the MPS server it starts opens those
    devices and not the whole GPU. Empty for a whole-GPU daemon, whose environment is left
    as it always was (every GPU visible), so a daemon started before this field existed is
    still the same daemon. A MIG daemon leaves the GPU's compute mode alone: that is a
    whole-GPU setting, and the GPU's other MIG devices may serve other claims."""
    multi_user: bool = False
    """NVIDIA's `mpsConfig.multiUser`: the daemon is started with `-M`, so one MPS server
    serves clients of every user ID; without it, a client of another uid waits until the
    running server's clients are done and the server is replaced."""

    retunable: bool = False
    """Its defaults follow what it serves while it runs (the DRA share daemon: the largest
    share prepared on its GPU): a spec differing from the running one only in the thread
    percentage and pinned limits is sent to the running daemon instead of restarting it,
    since a restart would cut every client of every share on the GPU."""

    def same_daemon(self, other: MpsDaemonSpec) -> bool:
        """Whether `other` can be served by this running daemon: equal, or both retunable and
        different only in their defaults."""
        if self == other:
            return True
        return (
            self.retunable
            and other.retunable
            and self.retuned(other.active_thread_percentage, other.pinned_mem_limits_mib) == other
        )

    def pinned_cleared(self, other: MpsDaemonSpec) -> tuple[int, ...]:
        """The device indices this daemon has a default pinned limit for that `other` has
        none for. NVIDIA documents no command that removes a default pinned limit
        (`set_default_device_pinned_mem_limit` takes a size; "no limit" is only the value
        of a daemon never given one), so a running daemon keeps such a limit until it is
        restarted: a retune cannot lift it."""
        wanted = dict(other.pinned_mem_limits_mib)
        return tuple(index for index, _ in self.pinned_mem_limits_mib if index not in wanted)

    def keeping_pinned(self, other: MpsDaemonSpec) -> MpsDaemonSpec:
        """`other` with the default pinned limits this daemon keeps (`pinned_cleared`): what
        a running daemon retuned to `other` serves, and what its settings read back."""
        limits = dict(self.pinned_mem_limits_mib) | dict(other.pinned_mem_limits_mib)
        return other.retuned(other.active_thread_percentage, tuple(sorted(limits.items())))

    def retuned(
        self, percentage: int, pinned_mem_limits_mib: tuple[tuple[int, int], ...]
    ) -> MpsDaemonSpec:
        return replace(
            self,
            active_thread_percentage=percentage,
            pinned_mem_limits_mib=pinned_mem_limits_mib,
        )

    @property
    def start_args(self) -> tuple[str, ...]:
        """The control program's arguments that start the daemon (NVIDIA's template)."""
        return ("-d", "-M") if self.multi_user else ("-d",)

    @property
    def commands(self) -> tuple[str, ...]:
        """The control commands sent after every start, in NVIDIA's order."""
        pinned = tuple(
            f"set_default_device_pinned_mem_limit {index} {mib}M"
            for index, mib in self.pinned_mem_limits_mib
        )
        return (*pinned, f"set_default_active_thread_percentage {self.active_thread_percentage}")

    @property
    def readbacks(self) -> tuple[tuple[str, str], ...]:
        """(command, the answer a daemon that took `commands` gives). The control program
        exits 0 whatever the daemon made of a setting (an out-of-range percentage is kept
        as it was, a malformed limit ignored: seen on driver 580), so reading the settings
        back is the only way to know they hold."""
        pinned = tuple(
            (f"get_default_device_pinned_mem_limit {index}", pinned_limit_shown(mib))
            for index, mib in self.pinned_mem_limits_mib
        )
        percentage = f"{float(self.active_thread_percentage):.1f}"
        return (*pinned, ("get_default_active_thread_percentage", percentage))


def pinned_limit_shown(mib: int) -> str:
    """How the control daemon prints a default pinned memory limit set to `mib` MiB.

    Read on an H200 with driver 580.159.04: below 1024 MiB as set (`512M`, `1023M`); from
    1024 MiB on in whole GiB rounded down (`1024M` and `2047M` -> `1G`, `35942M` -> `35G`);
    no limit (never set, or set to 0) prints nothing. The limit itself is kept in MiB (a
    client past 35942 MiB fails, not one past 35 GiB): only the answer is coarse.
    """
    if mib <= 0:
        return ""
    return f"{mib}M" if mib < 1024 else f"{mib // 1024}G"


def daemon_spec(resource: ResourcePlan, root: str) -> MpsDaemonSpec | None:
    """The daemon for one MPS resource; None when it has no whole GPU to serve.

    MIG devices are left out: NVIDIA's device plugin does not run MPS on MIG devices, and
    the plan rejects a node config asking for it before this is reached. (A DRA claim's
    `MigDeviceConfig` may ask for it, as with NVIDIA's DRA driver: `core.dra.claims`.)
    """
    uuids: list[GpuUuid] = []
    indices: list[int] = []
    memory: dict[int, int] = {}
    percentages: list[int] = []
    for dev in resource.devices:
        phys = dev.physical
        if phys.kind != "gpu":
            continue
        if phys.gpu_uuid not in uuids:
            uuids.append(phys.gpu_uuid)
            indices.append(phys.gpu_index)
        share = dev.mps or MpsShare.even(phys, dev.replicas)
        percentages.append(share.active_thread_percentage)
        mib = share.pinned_memory_limit_mib
        if mib:  # none on a unified-memory GPU: the daemon sets no memory limit there
            memory[phys.gpu_index] = min(mib, memory.get(phys.gpu_index, mib))
    if not uuids:
        return None
    return _spec_at(
        root,
        resource.name,
        tuple(uuids),
        tuple(indices),
        # One daemon-wide value; if shares ever differ, the smallest keeps every GPU within it.
        min(percentages),
        tuple(sorted(memory.items())),
    )


def _spec_at(
    root: str,
    resource: ResourceName,
    gpu_uuids: tuple[GpuUuid, ...],
    gpu_indices: tuple[int, ...],
    active_thread_percentage: int,
    pinned_mem_limits_mib: tuple[tuple[int, int], ...],
) -> MpsDaemonSpec:
    """A resource's daemon at its paths under `root` (the device plugin's layout)."""
    base = mps_root(root)
    return MpsDaemonSpec(
        resource=resource,
        root=base,
        pipe_dir=pipe_dir(base, resource),
        log_dir=log_dir(base, resource),
        shm_dir=shm_dir(base),
        started_marker=f"{resource_dir(base, resource)}/{STARTED_MARKER}",
        ready_marker=ready_marker(base),
        gpu_uuids=gpu_uuids,
        gpu_indices=gpu_indices,
        active_thread_percentage=active_thread_percentage,
        pinned_mem_limits_mib=pinned_mem_limits_mib,
    )


def mps_specs(plan: Plan) -> tuple[MpsDaemonSpec, ...]:
    """One spec per resource shared with MPS, in plan order."""
    specs = (
        daemon_spec(r, plan.allocate.mps_root)
        for r in plan.resources
        if r.strategy == SharingStrategy.MPS
    )
    return tuple(s for s in specs if s is not None)


def left_behind_spec(root: str, resource: str) -> MpsDaemonSpec:
    """A daemon an earlier agent left at `<root>/<resource>/` that no spec of the plan in
    force names (a config without MPS, a renamed resource): only its paths, to ask it to
    quit and read the settings its started marker records (`gpu_uuids` among them)."""
    return _spec_at(root, ResourceName(resource), (), (), 100, ())
