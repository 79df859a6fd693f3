"""Settings of the node agent: everything `gpuslice plugin` can be told, with NVIDIA's names.

Each field documents its unit, default and why, and carries its knob (`agent.knobs`): the
flag and the environment variable NVIDIA's plugin and config-manager use, so existing
DaemonSet manifests keep working. `cli.plugin` generates its options from these fields;
the field's default is the only one. Grouped by concern: `AgentSettings` (the node, its
config and the agent's endpoints), `ConfigFlags` (NVIDIA's flags that override the config
file), `GuardSettings` (the memory guard) and `DraSettings` (DRA mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import click

from gpuslice.agent.knobs import knob, knob_of
from gpuslice.core.caps import CapPolicy, CapsMode
from gpuslice.core.cdi.hook import DEFAULT_HOOK_PATH
from gpuslice.core.dra.publish import REPLICAS, SharesMode
from gpuslice.core.guard import GuardParams, Reserve, lookahead_for
from gpuslice.core.guard.model import ClaimOverride, GuardAction, GuardMode
from gpuslice.core.sharing.model import SOFT_LIMITS_DEFAULT
from gpuslice.podresources.client import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET

PATH = click.Path(path_type=Path)
PORT = click.IntRange(0, 65535)
"""A TCP port; 0 picks a free one (tests)."""


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _unwords(words: tuple[str, ...]) -> str:
    return " ".join(words)


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _unnames(names: tuple[str, ...]) -> str:
    return ",".join(names)


def _not(value: bool) -> bool:
    return not value


def _path_or_none(text: str) -> Path | None:
    return Path(text.strip()) if text.strip() else None


DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"


_GUARD = GuardParams()


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """The memory guard (docs/memory-guard.md); needs the metrics exporter's attribution."""

    mode: GuardMode = knob(
        _GUARD.mode,
        "--memory-guard",
        env="MEMORY_GUARD",
        chart="memoryGuard.mode",
        type=click.Choice(["off", "observe", "enforce"]),
        show_default=True,
        help="Memory guard for time-sliced GPUs (docs/memory-guard.md).",
    )
    """`MEMORY_GUARD`: see `core.guard.model.GuardParams` for mode, reserve, grace, strict."""
    reserve: Reserve = knob(
        _GUARD.reserve,
        "--memory-guard-reserve",
        env="MEMORY_GUARD_RESERVE",
        chart="memoryGuard.reserve",
        show_default=True,
        help="Free memory kept per GPU: a percentage, bytes, or a size (4Gi).",
        cli_default="10%",
        from_cli=Reserve.parse,
    )
    grace_s: float = knob(
        _GUARD.grace_s,
        "--memory-guard-grace",
        env="MEMORY_GUARD_GRACE",
        chart="memoryGuard.grace",
        type=click.FloatRange(min=0),
        show_default=True,
        help="Seconds pressure must last before a reclaim; also SIGTERM to SIGKILL.",
    )
    strict: bool = knob(
        _GUARD.strict,
        "--memory-guard-strict/--no-memory-guard-strict",
        env="MEMORY_GUARD_STRICT",
        chart="memoryGuard.strict",
        help="Stop any time-sliced pod over its share, even while memory is free.",
    )
    interval_s: float = knob(
        1.0,
        "--memory-guard-interval",
        env="MEMORY_GUARD_INTERVAL",
        chart="memoryGuard.interval",
        type=click.FloatRange(min=0.05),
        show_default=True,
        help="Seconds between memory guard polls.",
    )
    """`MEMORY_GUARD_INTERVAL`: seconds between polls. A leaker growing faster than
    reserve / (interval + grace) can still push a neighbour into OOM before it is stopped;
    one NVML process query per GPU per second costs well under 1 % of a core."""
    action: GuardAction = knob(
        "kill",
        "--memory-guard-action",
        env="MEMORY_GUARD_ACTION",
        chart="memoryGuard.action",
        type=click.Choice(["kill", "evict"]),
        show_default=True,
        help="Signal the container's processes, or evict the pod.",
    )
    """`MEMORY_GUARD_ACTION`: `kill` signals the container's processes (SIGTERM, SIGKILL after
    the grace: fast, the pod restarts in place) or `evict` uses the Eviction API (honours
    PodDisruptionBudgets; needs RBAC to create pods/eviction)."""
    claim_override: ClaimOverride = knob(
        "stricter-only",
        "--memory-guard-claim-override",
        env="MEMORY_GUARD_CLAIM_OVERRIDE",
        chart="memoryGuard.claimOverride",
        type=click.Choice(["stricter-only", "allow"]),
        show_default=True,
        help="DRA: may a claim's GuardConfig weaken the guard on a shared GPU (allow)?",
    )
    """`MEMORY_GUARD_CLAIM_OVERRIDE` (DRA mode): whether a claim's GuardConfig `mode` may
    weaken the guard on a GPU it shares with other claims or holds a share of. The claim's
    author is a tenant: with `off` its overrun stays on the GPU and the enforcing guard
    stops a neighbour instead, so by default (`stricter-only`) such a mode is ignored there
    and logged once; `allow` lets it apply. A claim alone on a whole GPU keeps its mode
    either way (only its own pods can suffer)."""
    soft_limits: bool = knob(
        SOFT_LIMITS_DEFAULT,
        "--memory-soft-limits/--no-memory-soft-limits",
        env="MEMORY_SOFT_LIMITS",
        chart="memoryGuard.softLimits",
        show_default=True,
        help="Pass time-sliced replicas their memory share as env hints.",
    )
    """`MEMORY_SOFT_LIMITS`: Allocate passes time-sliced replicas env hints with their share
    (TF allow-growth, JAX memory fraction, GPUSLICE_MEMORY_LIMIT_MIB, GPUSLICE_GPU_FRACTION)."""

    @property
    def params(self) -> GuardParams:
        """The core's policy parameters; the lookahead follows the poll interval."""
        return GuardParams(
            mode=self.mode,
            reserve=self.reserve,
            grace_s=self.grace_s,
            strict=self.strict,
            lookahead_s=lookahead_for(self.interval_s),
        )


@dataclass(frozen=True, slots=True)
class CapsSettings:
    """Memory caps (docs/memory-guard.md): the driver's per-container GPU memory limits
    (`nvmlDeviceSetMemoryLimits_v1`, driver r615+); the guard covers the GPUs they cannot."""

    mode: CapsMode = knob(
        "auto",
        "--memory-caps",
        env="MEMORY_CAPS",
        chart="memoryCaps.mode",
        type=click.Choice(["auto", "off"]),
        show_default=True,
        help="Cap each time-sliced container's GPU memory where the driver can (r615+).",
    )
    """`MEMORY_CAPS`: `auto` caps wherever the GPU, driver and node allow it (a node that
    cannot is left to the guard, the reason logged once); `off` never."""
    policy: CapPolicy = knob(
        "strict",
        "--memory-caps-policy",
        env="MEMORY_CAPS_POLICY",
        chart="memoryCaps.policy",
        type=click.Choice(["strict", "borrow"]),
        show_default=True,
        help="Hard limit: strict (the container's share) or borrow (the whole GPU).",
    )
    """`MEMORY_CAPS_POLICY`: soft limit = the entitlement always; hard = it too (`strict`)
    or the GPU (`borrow`: it may use what the others' soft limits do not hold back)."""
    hook_path: str = knob(
        DEFAULT_HOOK_PATH,
        "--memory-caps-hook-path",
        env="MEMORY_CAPS_HOOK_PATH",
        chart="memoryCaps.hookPath",
        show_default=True,
        help="The NVIDIA Container Toolkit's nvidia-cdi-hook, for DRA claim specs ('' none).",
    )
    """`MEMORY_CAPS_HOOK_PATH`: written into DRA claims' CDI specs only where it can work
    (cgroup v2, a capable GPU, the program there as the agent sees it); '' never."""
    hook_seen_at: str = knob(
        "",
        "--memory-caps-hook-seen-at",
        env="MEMORY_CAPS_HOOK_SEEN_AT",
        chart="memoryCaps.hookPath",
        help="Where the agent sees the hook program, when not at --memory-caps-hook-path.",
    )
    """`MEMORY_CAPS_HOOK_SEEN_AT`: the runtime runs the hook at `hook_path` on the host, but
    a DaemonSet sees the host's files only where it mounts them. The chart mounts the hook's
    host directory (not the file: a file's bind mount keeps the old inode when the toolkit
    is upgraded, and cannot show the program appearing) elsewhere and names it here; ''
    checks `hook_path` itself."""


DEFAULT_DRA_DRIVER = "gpu.nvidia.com"
DEFAULT_DRA_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_ROOT = Path("/var/run/cdi")


@dataclass(frozen=True, slots=True)
class DraSettings:
    """DRA mode (docs/dra.md): the node serves GPUs as a DRA driver instead of a device
    plugin. Never both on one node: the scheduler would count each GPU twice."""

    driver_name: str = knob(
        DEFAULT_DRA_DRIVER,
        "--dra-driver-name",
        env="DRA_DRIVER_NAME",
        chart="dra.driverName",
        show_default=True,
        help="DRA driver name (NVIDIA's, so its DeviceClasses and claims work unchanged).",
    )
    """`DRA_DRIVER_NAME`: NVIDIA's name by default, so DeviceClasses, CEL selectors and
    opaque configs written for NVIDIA's driver select and configure gpuslice unchanged
    (then NVIDIA's DRA driver must not run on the node)."""
    plugin_dir: Path | None = knob(
        None,
        "--dra-plugin-dir",
        env="DRA_PLUGIN_DIR",
        type=PATH,
        help="Directory of dra.sock and the checkpoint "
        "[default: /var/lib/kubelet/plugins/<driver>].",
    )
    """`DRA_PLUGIN_DIR`: where `dra.sock` and the checkpoint live; default
    `/var/lib/kubelet/plugins/<driver>`. Same path inside the pod and on the host."""
    registry_dir: Path = knob(
        DEFAULT_DRA_REGISTRY_DIR,
        "--dra-registry-dir",
        env="DRA_REGISTRY_DIR",
        chart="dra.registryDir",
        type=PATH,
        show_default=True,
        help="The kubelet's plugin-watcher directory.",
    )
    """`DRA_REGISTRY_DIR`: the kubelet's plugin-watcher directory."""
    cdi_root: Path = knob(
        DEFAULT_CDI_ROOT,
        "--cdi-root",
        env="CDI_ROOT",
        chart="dra.cdiRoot",
        type=PATH,
        show_default=True,
        help="Where the claims' and the node's base CDI specs are written (DRA mode).",
    )
    """`CDI_ROOT`: where the claims' CDI specs and the node's base spec are written for the
    container runtime."""
    resync_s: float = knob(
        10.0,
        "--dra-resync-interval",
        env="DRA_RESYNC_INTERVAL",
        type=click.FloatRange(min=0.1),
        show_default=True,
        help="Longest wait between retries after a failed ResourceSlice publish (the slices "
        "are watched: nothing is re-read at rest).",
    )
    """`DRA_RESYNC_INTERVAL`: seconds between checks that this node's ResourceSlices are
    still there (the kubelet deletes them when it restarts)."""
    consumable_shares: SharesMode = knob(
        REPLICAS,
        "--consumable-shares",
        env="CONSUMABLE_SHARES",
        chart="dra.consumableShares",
        show_default=True,
        help="Which GPUs DRA offers as consumable shares: 'replicas' (those the config shares, "
        "N ways), or NVIDIA's --consumable-shares values for every GPU and MIG device: "
        "'disabled', 'memory', 'unlimited' or a positive integer N (DRA mode).",
        to_cli=str,
        from_cli=SharesMode.parse,
    )
    """`CONSUMABLE_SHARES`: which devices are offered as consumable shares. gpuslice's
    `replicas` (the GPUs the config shares, N ways) by default; NVIDIA's
    `--consumable-shares` values (`disabled`, `memory`, `unlimited`, N) for every device of
    the node, so a cluster moving from NVIDIA's driver keeps its claims' meaning."""

    @property
    def plugin_path(self) -> Path:
        return self.plugin_dir or Path("/var/lib/kubelet/plugins") / self.driver_name


def _list(text: str) -> list[str]:
    return [v.strip() for v in str(text).split(",") if v.strip()]


@dataclass(frozen=True, slots=True)
class ConfigFlags:
    """NVIDIA's plugin flags that override the config file (`overrides`), each only when
    set on the command line or in the environment: left at its default, the file's value
    (or NVIDIA's default) applies, as NVIDIA's precedence rules say."""

    mig_strategy: str = knob(
        "none",
        "--mig-strategy",
        env="MIG_STRATEGY",
        help="Exposing MIG devices: none, single or mixed (NVIDIA's).",
        chart="migStrategy",
        overrides="flags.migStrategy",
    )
    fail_on_init_error: bool = knob(
        True,
        "--fail-on-init-error/--no-fail-on-init-error",
        env="FAIL_ON_INIT_ERROR",
        help="Exit on an initialization error; otherwise wait indefinitely.",
        chart="failOnInitError",
        overrides="flags.failOnInitError",
    )
    nvidia_driver_root: str = knob(
        "/",
        "--nvidia-driver-root",
        "--driver-root",
        env="NVIDIA_DRIVER_ROOT",
        help="Root of the NVIDIA driver on the host ('/' or '/run/nvidia/driver').",
        chart="nvidiaDriverRoot",
        overrides="flags.nvidiaDriverRoot",
    )
    nvidia_dev_root: str = knob(
        "",
        "--nvidia-dev-root",
        "--dev-root",
        env="NVIDIA_DEV_ROOT",
        help="Root of the NVIDIA device nodes on the host ('': the driver root).",
        overrides="flags.nvidiaDevRoot",
    )
    container_driver_root: str = knob(
        "/driver-root",
        "--container-driver-root",
        env="CONTAINER_DRIVER_ROOT",
        help="Where the host's driver root is mounted in the agent's container.",
        overrides="flags.plugin.containerDriverRoot",
    )
    mps_root: str = knob(
        "",
        "--mps-root",
        env="MPS_ROOT",
        help="Host directory of the MPS daemons' pipes, logs and shm ('': the config's).",
        chart="mps.root",
        overrides="flags.mpsRoot",
    )
    pass_device_specs: bool = knob(
        False,
        "--pass-device-specs/--no-pass-device-specs",
        env="PASS_DEVICE_SPECS",
        help="Pass the device nodes to the kubelet on Allocate.",
        overrides="flags.plugin.passDeviceSpecs",
    )
    device_list_strategy: list[str] = knob(
        "envvar",
        "--device-list-strategy",
        env="DEVICE_LIST_STRATEGY",
        help="envvar, volume-mounts, cdi-annotations and/or cdi-cri (comma-separated).",
        chart="deviceListStrategy",
        overrides="flags.plugin.deviceListStrategy",
        from_cli=_list,
    )
    device_id_strategy: str = knob(
        "uuid",
        "--device-id-strategy",
        env="DEVICE_ID_STRATEGY",
        help="Device IDs passed to the runtime: uuid or index.",
        chart="deviceIDStrategy",
        overrides="flags.plugin.deviceIDStrategy",
    )
    cdi_annotation_prefix: str = knob(
        "cdi.k8s.io/",
        "--cdi-annotation-prefix",
        env="CDI_ANNOTATION_PREFIX",
        help="Prefix of CDI container annotation keys.",
        overrides="flags.plugin.cdiAnnotationPrefix",
    )
    shared_devices_allocation_policy: str = knob(
        "distributed",
        "--shared-devices-allocation-policy",
        env="SHARED_DEVICES_ALLOCATION_POLICY",
        help="How replicas are picked: distributed or packed.",
        overrides="flags.plugin.sharedDevicesAllocationPolicy",
    )
    gdrcopy_enabled: bool = knob(
        False,
        "--gdrcopy-enabled/--no-gdrcopy-enabled",
        env="GDRCOPY_ENABLED",
        help="Start containers with NVIDIA_GDRCOPY=enabled.",
        overrides="flags.gdrcopyEnabled",
    )
    gds_enabled: bool = knob(
        False,
        "--gds-enabled/--no-gds-enabled",
        env="GDS_ENABLED",
        help="Start containers with NVIDIA_GDS=enabled.",
        overrides="flags.gdsEnabled",
    )
    mofed_enabled: bool = knob(
        False,
        "--mofed-enabled/--no-mofed-enabled",
        env="MOFED_ENABLED",
        help="Start containers with NVIDIA_MOFED=enabled.",
        overrides="flags.mofedEnabled",
    )
    device_discovery_strategy: str = knob(
        "auto",
        "--device-discovery-strategy",
        env="DEVICE_DISCOVERY_STRATEGY",
        show_default=True,
        help="NVIDIA's auto|nvml|tegra, validated like the config's value (vfio is refused, as "
        "NVIDIA's plugin refuses it); GPUs are found through NVML whatever it says.",
        overrides="flags.deviceDiscoveryStrategy",
    )


DRA_NEEDS_NODE_NAME = (
    "--dra needs --node-name (NODE_NAME): the node's name is the pool of its devices and "
    "selects its ResourceSlices, and the driver reads claims from the API"
)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str = knob(
        "nvml",
        "--node",
        env="GPUSLICE_NODE",
        show_default=True,
        help="GPU backend: nvml, or a simulated node spec such as sim:2xt4.",
    )
    """GPU backend: `nvml` (real GPUs) or a simulated node spec (`sim:2xt4`, a YAML file)."""
    config_path: Path | None = knob(
        None,
        "--config-file",
        "config_path",
        env="CONFIG_FILE",
        type=PATH,
        help="Config file, or a directory/ConfigMap/Helm values holding named configs.",
    )
    """`CONFIG_FILE`: one config file, or a directory / ConfigMap / Helm values of named configs."""
    config_name: str = knob("", "--config-name", env="CONFIG_NAME", help="Pin one named config.")
    """Pin one named config (wins over the node label)."""
    node_name: str = knob(
        "",
        "--node-name",
        env="NODE_NAME",
        help="This node's name: enables the config label watch and Events.",
    )
    """`NODE_NAME`: this node, for the label watch and Events. Empty: no Kubernetes API use."""
    node_label: str = knob(
        DEFAULT_NODE_LABEL,
        "--node-label",
        env="NODE_LABEL",
        help="Node label whose value names this node's config.",
        chart="config.nodeLabel",
        show_default=True,
    )
    """`NODE_LABEL`: the node label whose value names the config to use."""
    default_config: str = knob(
        "",
        "--default-config",
        env="DEFAULT_CONFIG",
        help="Named config for a node without the label.",
        chart="config.default",
    )
    """`DEFAULT_CONFIG`: config used when the node has no label."""
    fallback_strategies: tuple[str, ...] = knob(
        ("named", "single"),
        "--fallback-strategies",
        env="FALLBACK_STRATEGIES",
        help="Tried in order without label or default: named, single, empty.",
        chart="config.fallbackStrategies",
        show_default=True,
        to_cli=_unnames,
        from_cli=_names,
    )
    """`FALLBACK_STRATEGIES`, NVIDIA's Helm default."""
    overrides: Mapping[str, object] = field(default_factory=dict)
    """Config paths set by flags or environment (`flags.migStrategy` -> "single"): they win
    over the file, as NVIDIA's precedence rules say."""
    plugin_dir: Path = knob(
        DEFAULT_PLUGIN_DIR,
        "--device-plugin-path",
        "plugin_dir",
        env="DEVICE_PLUGIN_PATH",
        help="The kubelet's device plugin directory (plugin sockets).",
        type=PATH,
        show_default=True,
    )
    """Where plugin sockets live and the kubelet's `kubelet.sock` is."""
    kubelet_socket: Path | None = knob(
        DEFAULT_PLUGIN_DIR / "kubelet.sock",
        "--kubelet-socket",
        env="KUBELET_SOCKET",
        help="Kubelet registration socket ('' to skip registration). "
        "Default: <device-plugin-path>/kubelet.sock.",
        cli_default=None,
    )
    """`KUBELET_SOCKET`; None skips registration (standalone runs). The flag's default is
    `kubelet.sock` under the plugin directory (`resolve_cli`)."""
    reload_interval_s: float = knob(
        1.0,
        "--config-poll-interval",
        "reload_interval_s",
        env="GPUSLICE_CONFIG_POLL_INTERVAL",
        type=click.FloatRange(min=0.05),
        hidden=True,
        help="Seconds between checks of the config path for changes (tests shorten it).",
    )
    """How long a changed config must hold still before it is read (seconds), and how often
    it is checked where its directories cannot be watched with inotify. ConfigMap volumes
    update within about a minute; one second keeps the agent's own delay negligible."""
    config_rescan_s: float = 30.0
    """Safety net while inotify watches the config's directories: changes wake the check
    at once; this only bounds how long a change inotify cannot see stays unnoticed."""
    inventory_interval_s: float = knob(
        30.0,
        "--inventory-interval",
        "inventory_interval_s",
        env="INVENTORY_INTERVAL",
        type=click.FloatRange(min=0.1),
        show_default=True,
        help="Seconds between GPU inventory re-reads (MIG mode and layout changes).",
    )
    """How often the GPU inventory is re-read (seconds), so MIG mode and layout changes made
    on a running node (`nvidia-smi mig -cgi`, mig-parted) are re-planned without a restart."""
    sim_control_dir: Path | None = knob(
        None, env="GPUSLICE_SIM_CONTROL_DIR", from_cli=_path_or_none
    )
    """`GPUSLICE_SIM_CONTROL_DIR`: the control directory a simulated node polls for injected
    events (`backends.simulated.control`); tests and the demo set it. None: the node file's
    `controlDir`, if any."""
    health_poll_s: float = 30.0
    """Longest wait of one blocking health-event call (seconds). Shutdown does not wait for
    it (closing the backend wakes the waiting thread), so it only sets how often an idle
    daemon wakes up for nothing."""
    disable_healthchecks: str | None = knob(None, env="DP_DISABLE_HEALTHCHECKS")
    """`DP_DISABLE_HEALTHCHECKS`."""
    enable_healthchecks: str | None = knob(None, env="DP_ENABLE_HEALTHCHECKS")
    """`DP_ENABLE_HEALTHCHECKS`."""
    labels_file: Path | None = knob(
        None,
        "--labels-file",
        env="GFD_OUTPUT_FILE",
        chart="labels.featuresDir",
        type=PATH,
        help="NFD features.d file for GFD labels (default: flags.gfd.outputFile).",
    )
    """Where GFD labels are written (NFD features.d); None: `flags.gfd.outputFile` of the config,
    or no file when labels are disabled."""
    labels_mode: str = knob(
        "file",
        "--labels-mode",
        env="LABELS_MODE",
        chart="labels.mode",
        type=click.Choice(["file", "api", "off"]),
        show_default=True,
        help="Write GFD labels to the NFD features.d file, patch the Node, or neither.",
    )
    """`LABELS_MODE`: `file` (NFD local feature file, GFD's classic mode), `api` (patch the
    Node's labels directly; needs RBAC to patch nodes) or `off`."""
    no_timestamp: bool = knob(
        False,
        "--no-timestamp",
        env="GFD_NO_TIMESTAMP",
        help="Omit the nvidia.com/gfd.timestamp label.",
        chart="labels.noTimestamp",
        is_flag=True,
    )
    """`GFD_NO_TIMESTAMP`: omit `nvidia.com/gfd.timestamp` (also `flags.gfd.noTimestamp`)."""
    namespace: str = knob("default", "--namespace", env="NAMESPACE", help="Namespace for Events.")
    """`NAMESPACE`: the agent pod's namespace, where its Events are created."""
    pod_name: str = knob("", env="POD_NAME", from_cli=str.strip)
    """`POD_NAME` (downward API): the agent's own Pod, which its Events are about (the
    API server takes an Event only in the namespace of what it is about). Empty outside a
    pod: Events are then on the Node, in `default`."""
    pod_uid: str = knob("", env="POD_UID", from_cli=str.strip)
    """`POD_UID` (downward API): the agent's own pod, which the memory guard never signals
    and its Events name. Empty: the guard reads it from the agent's own cgroup."""
    initial_label_wait_s: float = 10.0
    """How long the first plan waits for the node's config label from the API server.
    NVIDIA's config-manager stopped blocking here (v0.18.2) and may then select a config
    before its informer has synced; a short bounded wait avoids applying the wrong config."""
    metrics_port: int | None = knob(
        None,
        "--metrics-port",
        env="METRICS_PORT",
        chart="metrics.port",
        type=PORT,
        help="Serve /metrics, /healthz, /readyz and /status on this port.",
    )
    """`METRICS_PORT`: port of the agent's HTTP endpoint (`/metrics`, `/healthz`, `/readyz`,
    `/status`); None disables it. 0 picks a free port (tests). The chart always sets it, since
    the kubelet's probes need it; `gpu_metrics` turns off the GPU telemetry instead."""
    metrics_address: str = knob(
        "0.0.0.0",
        "--metrics-address",
        env="METRICS_ADDRESS",
        chart="metrics.address",
        show_default=True,
        help="Address the metrics/probe endpoint binds (:: for IPv6).",
    )
    """`METRICS_ADDRESS`: address the HTTP endpoint binds (`::` for IPv6, `127.0.0.1` to keep
    it on the node)."""
    health_port: int | None = knob(
        None,
        "--health-port",
        env="HEALTH_PORT",
        chart="probes.port",
        type=PORT,
        help="Also serve /healthz and /readyz alone on this port (the chart's probes use it).",
    )
    """`HEALTH_PORT`: a listener of the probes' own (`/healthz`, `/readyz` only), so load on
    the scrape port never reaches them; None: the probes are served on `metrics_port` only.
    It binds `metrics_address`."""
    http_head_timeout_s: float = knob(
        5.0,
        "--http-head-timeout",
        "http_head_timeout_s",
        env="HTTP_HEAD_TIMEOUT",
        type=click.FloatRange(0, 3600, min_open=True),
        show_default=True,
        help="Seconds a client has to send a whole request head to the HTTP endpoints.",
    )
    """`HTTP_HEAD_TIMEOUT`: seconds a client has to send a whole request head to either
    listener (idle keep-alive time included)."""
    http_max_per_address: int = knob(
        16,
        "--http-max-per-address",
        env="HTTP_MAX_PER_ADDRESS",
        type=click.IntRange(1, 100000),
        show_default=True,
        help="Connections one client address may hold open on an HTTP endpoint.",
    )
    """`HTTP_MAX_PER_ADDRESS`: connections one client address may hold open on a listener."""
    gpu_metrics: bool = knob(
        True,
        "--gpu-metrics/--no-gpu-metrics",
        env="GPU_METRICS",
        chart="metrics.enabled",
        show_default=True,
        help="Gather GPU and per-pod telemetry; off, the endpoint serves only probes and counters.",
    )
    """`GPU_METRICS`: gather GPU and per-pod telemetry (NVML, PodResources, /proc). Off, the
    endpoint still serves the plugin's own counters and the probes, and `/status` has no pods."""
    pod_resources_socket: Path = knob(
        DEFAULT_POD_RESOURCES_SOCKET,
        "--pod-resources-socket",
        env="POD_RESOURCES_SOCKET",
        help="The kubelet's PodResources socket (which pod holds which device).",
        type=PATH,
        show_default=True,
    )
    metrics_interval_s: float = knob(
        10.0,
        "--metrics-interval",
        "metrics_interval_s",
        env="METRICS_INTERVAL",
        type=click.FloatRange(min=0.1),
        show_default=True,
        help="Seconds between metric snapshots.",
    )
    """Seconds between metric snapshots (NVML and /proc reads); scrapes in between read the
    same snapshot, so a scrape never waits on NVML."""
    proc_root: Path = knob(
        Path("/proc"),
        "--proc-root",
        env="PROC_ROOT",
        type=PATH,
        show_default=True,
        help="Host /proc (for per-pod attribution; needs hostPID).",
    )
    """Where `/proc/<pid>/cgroup` is read for per-pod attribution; the host's /proc under
    hostPID. Tests point it at a fake tree."""
    cgroup_root: Path = knob(
        Path("/sys/fs/cgroup"),
        "--cgroup-root",
        env="CGROUP_ROOT",
        chart="memoryCaps.cgroupRoot",
        type=PATH,
        show_default=True,
        help="The host's cgroup filesystem (memory caps: containers' cgroups, cgroup v2).",
    )
    """Where memory caps find the containers' cgroups and tell cgroup v2 from v1 (NVML's
    `nameSpace` is a path under it). Tests point it at a fake tree."""
    mps_control: tuple[str, ...] = knob(
        ("nvidia-cuda-mps-control",),
        "--mps-control",
        env="MPS_CONTROL",
        help="Command running the MPS control program.",
        to_cli=_unwords,
        from_cli=_words,
    )
    """Command that runs the MPS control program (tests use the fake one)."""
    mps_shm_tmpfs: bool = knob(
        True,
        "--mps-shm-tmpfs/--no-mps-shm-tmpfs",
        env="MPS_SHM_TMPFS",
        show_default=True,
        help="Mount a size-limited tmpfs on each MPS daemon's shm directory.",
    )
    """Each MPS daemon's shm directory (its clients' `/dev/shm`) gets a tmpfs of half the
    node's memory, as NVIDIA's DRA driver mounts it, so a tenant's writes are memory charged
    to its pod rather than the node's disk (`mps.shm`). Needs CAP_SYS_ADMIN and a mount that
    propagates to the host; where either is missing the directory stays plain, said once
    per directory. The test suite turns it off (`tests/conftest.py`) except where it tests
    the mount, so no test leaves a tmpfs on the machine."""
    mps_health_interval_s: float = knob(
        2.0,
        "--mps-health-interval",
        "mps_health_interval_s",
        env="MPS_HEALTH_INTERVAL",
        type=click.FloatRange(min=0.1),
        show_default=True,
        help="Seconds between MPS daemon health checks.",
    )
    """Seconds between health commands to each MPS daemon: how fast a crashed daemon is
    noticed, its replicas withdrawn and the daemon restarted. Each check runs the control
    program once, so a few seconds keeps the cost negligible."""
    set_compute_mode: bool = knob(
        True,
        "--no-compute-mode",
        "set_compute_mode",
        is_flag=True,
        help="Do not set EXCLUSIVE_PROCESS on MPS GPUs.",
        to_cli=_not,
        from_cli=_not,
    )
    """Set EXCLUSIVE_PROCESS on MPS GPUs (NVIDIA does); off where nvidia-smi is absent."""
    nvidia_smi: tuple[str, ...] = knob(
        ("nvidia-smi",),
        "--nvidia-smi",
        env="NVIDIA_SMI",
        show_default=True,
        help="nvidia-smi command: MPS GPUs' compute mode, claims' time-slice intervals.",
        to_cli=_unwords,
        from_cli=_words,
    )
    """`NVIDIA_SMI`: sets MPS GPUs' compute mode (both modes) and a claim's time-slice
    interval (`compute-policy --set-timeslice`, DRA mode)."""
    kubeconfig: Path | None = knob(
        None,
        "--kubeconfig",
        env="KUBECONFIG",
        help="Kubeconfig file; unset: in-cluster credentials.",
        type=PATH,
    )
    memory_guard: GuardSettings = field(default_factory=GuardSettings)
    memory_caps: CapsSettings = field(default_factory=CapsSettings)
    node_lock_wait_s: float | None = knob(
        None,
        "--node-lock-wait",
        "node_lock_wait_s",
        env="NODE_LOCK_WAIT",
        type=click.FloatRange(min=0),
        help="Seconds to wait while another agent holds this node's lock, then exit "
        "[default: wait until it is released].",
    )
    """`NODE_LOCK_WAIT`: seconds to wait for the node's lock while another agent holds it
    (a force-deleted pod still running, an overlapping release), then exit with one line;
    None waits as long as it takes, which a rollout whose old pod is still terminating
    needs (docs/install.md#one-agent-per-node)."""
    dra: DraSettings | None = None
    """`DRA`: serve this node's GPUs as a DRA driver instead of device plugins (None: the
    device plugin, the default)."""

    def problems(self) -> list[str]:
        """The rules between settings, in one place: what makes a combination unusable.
        The CLI refuses such settings before anything starts; `agent.build` trusts them."""
        found = []
        if self.dra is not None and not self.node_name:
            found.append(DRA_NEEDS_NODE_NAME)
        if self.metrics_port and self.metrics_port == self.health_port:
            found.append(
                f"the metrics port and the health port are both {self.metrics_port}: "
                f"{knob_of(AgentSettings, 'metrics_port').names()} and "
                f"{knob_of(AgentSettings, 'health_port').names()} must differ (the probes have "
                "a listener of their own)"
            )
        return found
