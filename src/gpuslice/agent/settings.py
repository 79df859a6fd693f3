"""Settings of the node agent: everything `gpuslice plugin` can be told, with NVIDIA's names.

Each field documents its unit, default and why. The CLI fills these from flags and the
environment variables NVIDIA's plugin and config-manager use, so existing DaemonSet
manifests keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.dra.publish import REPLICAS, SharesMode
from gpuslice.core.guard import GuardParams
from gpuslice.core.guard.model import ClaimOverride, GuardAction

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """The memory guard (docs/memory-guard.md); needs the metrics exporter's attribution."""

    params: GuardParams = field(default_factory=GuardParams)
    """`MEMORY_GUARD*`: mode (default `observe`), reserve (default 10 % of each GPU), grace
    (default 1 s), strict (default off); see `core.guard.model.GuardParams`."""
    interval_s: float = 1.0
    """`MEMORY_GUARD_INTERVAL`: seconds between polls. A leaker growing faster than
    reserve / (interval + grace) can still push a neighbour into OOM before it is stopped;
    one NVML process query per GPU per second costs well under 1 % of a core."""
    action: GuardAction = "kill"
    """`MEMORY_GUARD_ACTION`: `kill` signals the container's processes (SIGTERM, SIGKILL after
    the grace: fast, the pod restarts in place) or `evict` uses the Eviction API (honours
    PodDisruptionBudgets; needs RBAC to create pods/eviction)."""
    claim_override: ClaimOverride = "stricter-only"
    """`MEMORY_GUARD_CLAIM_OVERRIDE` (DRA mode): whether a claim's GuardConfig `mode` may
    weaken the guard on a GPU it shares with other claims or holds a share of. The claim's
    author is a tenant: with `off` its overrun stays on the GPU and the enforcing guard
    stops a neighbour instead, so by default (`stricter-only`) such a mode is ignored there
    and logged once; `allow` lets it apply. A claim alone on a whole GPU keeps its mode
    either way (only its own pods can suffer)."""
    soft_limits: bool = True
    """`MEMORY_SOFT_LIMITS`: Allocate passes time-sliced replicas env hints with their share
    (TF allow-growth, JAX memory fraction, GPUSLICE_MEMORY_LIMIT_MIB, GPUSLICE_GPU_FRACTION)."""


DEFAULT_DRA_DRIVER = "gpu.nvidia.com"
DEFAULT_DRA_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_ROOT = Path("/var/run/cdi")


@dataclass(frozen=True, slots=True)
class DraSettings:
    """DRA mode (docs/dra.md): the node serves GPUs as a DRA driver instead of a device
    plugin. Never both on one node: the scheduler would count each GPU twice."""

    driver_name: str = DEFAULT_DRA_DRIVER
    """`DRA_DRIVER_NAME`: NVIDIA's name by default, so DeviceClasses, CEL selectors and
    opaque configs written for NVIDIA's driver select and configure gpuslice unchanged
    (then NVIDIA's DRA driver must not run on the node)."""
    plugin_dir: Path | None = None
    """`DRA_PLUGIN_DIR`: where `dra.sock` and the checkpoint live; default
    `/var/lib/kubelet/plugins/<driver>`. Same path inside the pod and on the host."""
    registry_dir: Path = DEFAULT_DRA_REGISTRY_DIR
    """`DRA_REGISTRY_DIR`: the kubelet's plugin-watcher directory."""
    cdi_root: Path = DEFAULT_CDI_ROOT
    """`CDI_ROOT`: where per-claim CDI specs are written for the container runtime."""
    resync_s: float = 10.0
    """`DRA_RESYNC_INTERVAL`: seconds between checks that this node's ResourceSlices are
    still there (the kubelet deletes them when it restarts)."""
    consumable_shares: SharesMode = REPLICAS
    """`CONSUMABLE_SHARES`: which devices are offered as consumable shares. gpuslice's
    `replicas` (the GPUs the config shares, N ways) by default; NVIDIA's
    `--consumable-shares` values (`disabled`, `memory`, `unlimited`, N) for every device of
    the node, so a cluster moving from NVIDIA's driver keeps its claims' meaning."""

    @property
    def plugin_path(self) -> Path:
        return self.plugin_dir or Path("/var/lib/kubelet/plugins") / self.driver_name


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str = "nvml"
    """GPU backend: `nvml` (real GPUs) or a simulated node spec (`sim:2xt4`, a YAML file)."""
    config_path: Path | None = None
    """`CONFIG_FILE`: one config file, or a directory / ConfigMap / Helm values of named configs."""
    config_name: str = ""
    """Pin one named config (wins over the node label)."""
    node_name: str = ""
    """`NODE_NAME`: this node, for the label watch and Events. Empty: no Kubernetes API use."""
    node_label: str = DEFAULT_NODE_LABEL
    """`NODE_LABEL`: the node label whose value names the config to use."""
    default_config: str = ""
    """`DEFAULT_CONFIG`: config used when the node has no label."""
    fallback_strategies: tuple[str, ...] = ("named", "single")
    """`FALLBACK_STRATEGIES`, NVIDIA's Helm default."""
    overrides: Mapping[str, object] = field(default_factory=dict)
    """Config paths set by flags or environment (`flags.migStrategy` -> "single"): they win
    over the file, as NVIDIA's precedence rules say."""
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    """Where plugin sockets live and the kubelet's `kubelet.sock` is."""
    kubelet_socket: Path | None = DEFAULT_PLUGIN_DIR / "kubelet.sock"
    """`KUBELET_SOCKET`; None skips registration (standalone runs)."""
    reload_interval_s: float = 1.0
    """How long a changed config must hold still before it is read (seconds), and how often
    it is checked where its directories cannot be watched with inotify. ConfigMap volumes
    update within about a minute; one second keeps the agent's own delay negligible."""
    config_rescan_s: float = 30.0
    """Safety net while inotify watches the config's directories: changes wake the check
    at once; this only bounds how long a change inotify cannot see stays unnoticed."""
    inventory_interval_s: float = 30.0
    """How often the GPU inventory is re-read (seconds), so MIG mode and layout changes made
    on a running node (`nvidia-smi mig -cgi`, mig-parted) are re-planned without a restart."""
    health_poll_s: float = 30.0
    """Longest wait of one blocking health-event call (seconds). Shutdown does not wait for
    it (closing the backend wakes the waiting thread), so it only sets how often an idle
    daemon wakes up for nothing."""
    disable_healthchecks: str | None = None
    """`DP_DISABLE_HEALTHCHECKS`."""
    enable_healthchecks: str | None = None
    """`DP_ENABLE_HEALTHCHECKS`."""
    labels_file: Path | None = None
    """Where GFD labels are written (NFD features.d); None: `flags.gfd.outputFile` of the config,
    or no file when labels are disabled."""
    labels_mode: str = "file"
    """`LABELS_MODE`: `file` (NFD local feature file, GFD's classic mode), `api` (patch the
    Node's labels directly; needs RBAC to patch nodes) or `off`."""
    no_timestamp: bool = False
    """`GFD_NO_TIMESTAMP`: omit `nvidia.com/gfd.timestamp` (also `flags.gfd.noTimestamp`)."""
    namespace: str = "default"
    """`NAMESPACE`: the agent pod's namespace, where its Events are created."""
    pod_name: str = ""
    """`POD_NAME` (downward API): the agent's own Pod, which its Events are about (the
    API server takes an Event only in the namespace of what it is about). Empty outside a
    pod: Events are then on the Node, in `default`."""
    initial_label_wait_s: float = 10.0
    """How long the first plan waits for the node's config label from the API server.
    NVIDIA's config-manager stopped blocking here (v0.18.2) and may then select a config
    before its informer has synced; a short bounded wait avoids applying the wrong config."""
    metrics_port: int | None = None
    """`METRICS_PORT`: port of the agent's HTTP endpoint (`/metrics`, `/healthz`, `/readyz`,
    `/status`); None disables it. 0 picks a free port (tests). The chart always sets it, since
    the kubelet's probes need it; `gpu_metrics` turns off the GPU telemetry instead."""
    metrics_address: str = "0.0.0.0"
    """`METRICS_ADDRESS`: address the HTTP endpoint binds (`::` for IPv6, `127.0.0.1` to keep
    it on the node)."""
    health_port: int | None = None
    """`HEALTH_PORT`: a listener of the probes' own (`/healthz`, `/readyz` only), so load on
    the scrape port never reaches them; None: the probes are served on `metrics_port` only.
    It binds `metrics_address`."""
    http_head_timeout_s: float = 5.0
    """`HTTP_HEAD_TIMEOUT`: seconds a client has to send a whole request head to either
    listener (idle keep-alive time included)."""
    http_max_per_address: int = 16
    """`HTTP_MAX_PER_ADDRESS`: connections one client address may hold open on a listener."""
    gpu_metrics: bool = True
    """`GPU_METRICS`: gather GPU and per-pod telemetry (NVML, PodResources, /proc). Off, the
    endpoint still serves the plugin's own counters and the probes, and `/status` has no pods."""
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    metrics_interval_s: float = 10.0
    """Seconds between metric snapshots (NVML and /proc reads); scrapes in between read the
    same snapshot, so a scrape never waits on NVML."""
    proc_root: Path = Path("/proc")
    """Where `/proc/<pid>/cgroup` is read for per-pod attribution; the host's /proc under
    hostPID. Tests point it at a fake tree."""
    mps_control: tuple[str, ...] = ("nvidia-cuda-mps-control",)
    """Command that runs the MPS control program (tests use the fake one)."""
    mps_health_interval_s: float = 2.0
    """Seconds between health commands to each MPS daemon: how fast a crashed daemon is
    noticed, its replicas withdrawn and the daemon restarted. Each check runs the control
    program once, so a few seconds keeps the cost negligible."""
    set_compute_mode: bool = True
    """Set EXCLUSIVE_PROCESS on MPS GPUs (NVIDIA does); off where nvidia-smi is absent."""
    nvidia_smi: tuple[str, ...] = ("nvidia-smi",)
    """`NVIDIA_SMI`: sets MPS GPUs' compute mode (both modes) and a claim's time-slice
    interval (`compute-policy --set-timeslice`, DRA mode)."""
    kubeconfig: Path | None = None
    memory_guard: GuardSettings = field(default_factory=GuardSettings)
    node_lock_wait_s: float | None = None
    """`NODE_LOCK_WAIT`: seconds to wait for the node's lock while another agent holds it
    (a force-deleted pod still running, an overlapping release), then exit with one line;
    None waits as long as it takes, which a rollout whose old pod is still terminating
    needs (docs/install.md#one-agent-per-node)."""
    dra: DraSettings | None = None
    """`DRA`: serve this node's GPUs as a DRA driver instead of device plugins (None: the
    device plugin, the default)."""
