"""`gpuslice plugin`: the node daemon, with NVIDIA's flag and environment variable names.

A flag or variable that is set overrides the config file (NVIDIA's precedence); one left at
its default does not, so the file's value (or NVIDIA's default) applies.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from gpuslice.agent.build import build_agent
from gpuslice.agent.configs import load_config
from gpuslice.agent.node_lock import holding_the_node
from gpuslice.agent.runner import Agent
from gpuslice.agent.settings import (
    DEFAULT_CDI_ROOT,
    DEFAULT_DRA_DRIVER,
    DEFAULT_DRA_REGISTRY_DIR,
    DEFAULT_NODE_LABEL,
    DEFAULT_PLUGIN_DIR,
    AgentSettings,
    DraSettings,
    GuardSettings,
)
from gpuslice.agent.watchdog import LoopWatchdog, install_shutdown_signals
from gpuslice.cli.errors import reports_errors
from gpuslice.cli.logsetup import setup_logging
from gpuslice.core.dra.publish import SharesMode
from gpuslice.core.errors import GpusliceError
from gpuslice.core.guard import GuardParams, Reserve, lookahead_for
from gpuslice.logs import get_logger
from gpuslice.ports import BackendError

# CLI option name -> config path it overrides (NVIDIA's flag -> file field mapping).
OVERRIDES = {
    "mig_strategy": "flags.migStrategy",
    "fail_on_init_error": "flags.failOnInitError",
    "nvidia_driver_root": "flags.nvidiaDriverRoot",
    "nvidia_dev_root": "flags.nvidiaDevRoot",
    "container_driver_root": "flags.plugin.containerDriverRoot",
    "mps_root": "flags.mpsRoot",
    "pass_device_specs": "flags.plugin.passDeviceSpecs",
    "device_list_strategy": "flags.plugin.deviceListStrategy",
    "device_id_strategy": "flags.plugin.deviceIDStrategy",
    "cdi_annotation_prefix": "flags.plugin.cdiAnnotationPrefix",
    "shared_devices_allocation_policy": "flags.plugin.sharedDevicesAllocationPolicy",
    "gdrcopy_enabled": "flags.gdrcopyEnabled",
    "gds_enabled": "flags.gdsEnabled",
    "mofed_enabled": "flags.mofedEnabled",
    "device_discovery_strategy": "flags.deviceDiscoveryStrategy",
}

SHUTDOWN_GRACE_S = 20.0
"""Hard-exit deadline after SIGTERM: shorter than a pod's default 30 s grace period, so the
kubelet never has to SIGKILL us with sockets left behind."""


def _labels_mode(params: dict[str, Any]) -> str:
    """A simulated node writes its labels only where told (`--labels-file`): the default
    path is the real NFD directory, and simulated labels there would relabel a real node."""
    if params["no_labels"]:
        return "off"
    mode = str(params["labels_mode"])
    if mode == "file" and params["labels_file"] is None and params["node"] != "nvml":
        get_logger("gpuslice").warning(
            "labels-off",
            reason="simulated-node",
            node=params["node"],
            hint="pass --labels-file to write them",
        )
        return "off"
    return mode


def _overrides(ctx: click.Context, params: dict[str, Any]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, path in OVERRIDES.items():
        source = ctx.get_parameter_source(name)
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            value = params[name]
            if name == "device_list_strategy":
                value = [v.strip() for v in str(value).split(",") if v.strip()]
            out[path] = value
    return out


@click.command()
@click.option(
    "--config-file",
    envvar="CONFIG_FILE",
    type=click.Path(path_type=Path),
    help="Config file, or a directory/ConfigMap/Helm values holding named configs.",
)
@click.option("--config-name", envvar="CONFIG_NAME", default="", help="Pin one named config.")
@click.option(
    "--node",
    envvar="GPUSLICE_NODE",
    default="nvml",
    show_default=True,
    help="GPU backend: nvml, or a simulated node spec such as sim:2xt4.",
)
@click.option(
    "--device-plugin-path",
    envvar="DEVICE_PLUGIN_PATH",
    type=click.Path(path_type=Path),
    default=DEFAULT_PLUGIN_DIR,
    show_default=True,
)
@click.option(
    "--kubelet-socket",
    envvar="KUBELET_SOCKET",
    default=None,
    help="Kubelet registration socket ('' to skip registration). "
    "Default: <device-plugin-path>/kubelet.sock.",
)
@click.option("--mig-strategy", envvar="MIG_STRATEGY", default="none")
@click.option(
    "--fail-on-init-error/--no-fail-on-init-error", envvar="FAIL_ON_INIT_ERROR", default=True
)
@click.option("--nvidia-driver-root", "--driver-root", envvar="NVIDIA_DRIVER_ROOT", default="/")
@click.option("--nvidia-dev-root", "--dev-root", envvar="NVIDIA_DEV_ROOT", default="")
@click.option(
    "--container-driver-root",
    envvar="CONTAINER_DRIVER_ROOT",
    default="/driver-root",
    help="Where the host's driver root is mounted in the agent's container.",
)
@click.option("--mps-root", envvar="MPS_ROOT", default="")
@click.option(
    "--pass-device-specs/--no-pass-device-specs", envvar="PASS_DEVICE_SPECS", default=False
)
@click.option("--device-list-strategy", envvar="DEVICE_LIST_STRATEGY", default="envvar")
@click.option("--device-id-strategy", envvar="DEVICE_ID_STRATEGY", default="uuid")
@click.option("--cdi-annotation-prefix", envvar="CDI_ANNOTATION_PREFIX", default="cdi.k8s.io/")
@click.option(
    "--shared-devices-allocation-policy",
    envvar="SHARED_DEVICES_ALLOCATION_POLICY",
    default="distributed",
)
@click.option("--gdrcopy-enabled/--no-gdrcopy-enabled", envvar="GDRCOPY_ENABLED", default=False)
@click.option("--gds-enabled/--no-gds-enabled", envvar="GDS_ENABLED", default=False)
@click.option("--mofed-enabled/--no-mofed-enabled", envvar="MOFED_ENABLED", default=False)
@click.option(
    "--device-discovery-strategy",
    envvar="DEVICE_DISCOVERY_STRATEGY",
    default="auto",
    show_default=True,
    help="NVIDIA's auto|nvml|tegra, validated like the config's value (vfio is refused, as "
    "NVIDIA's plugin refuses it); GPUs are found through NVML whatever it says.",
)
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    default="",
    help="This node's name: enables the config label watch and Events.",
)
@click.option("--node-label", envvar="NODE_LABEL", default=DEFAULT_NODE_LABEL, show_default=True)
@click.option("--default-config", envvar="DEFAULT_CONFIG", default="")
@click.option(
    "--fallback-strategies", envvar="FALLBACK_STRATEGIES", default="named,single", show_default=True
)
@click.option(
    "--labels-file",
    envvar="GFD_OUTPUT_FILE",
    type=click.Path(path_type=Path),
    default=None,
    help="NFD features.d file for GFD labels (default: flags.gfd.outputFile).",
)
@click.option("--no-labels", is_flag=True, default=False, help="Do not write node labels.")
@click.option(
    "--labels-mode",
    envvar="LABELS_MODE",
    type=click.Choice(["file", "api", "off"]),
    default="file",
    show_default=True,
    help="Write GFD labels to the NFD features.d file, patch the Node, or neither.",
)
@click.option("--no-timestamp", envvar="GFD_NO_TIMESTAMP", is_flag=True, default=False)
@click.option("--namespace", envvar="NAMESPACE", default="default", help="Namespace for Events.")
@click.option(
    "--metrics-port",
    envvar="METRICS_PORT",
    type=int,
    default=None,
    help="Serve /metrics, /healthz, /readyz and /status on this port.",
)
@click.option(
    "--metrics-address",
    envvar="METRICS_ADDRESS",
    default="0.0.0.0",
    show_default=True,
    help="Address the metrics/probe endpoint binds (:: for IPv6).",
)
@click.option(
    "--health-port",
    envvar="HEALTH_PORT",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also serve /healthz and /readyz alone on this port (the chart's probes use it).",
)
@click.option(
    "--http-head-timeout",
    envvar="HTTP_HEAD_TIMEOUT",
    type=click.FloatRange(0, 3600, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds a client has to send a whole request head to the HTTP endpoints.",
)
@click.option(
    "--http-max-per-address",
    envvar="HTTP_MAX_PER_ADDRESS",
    type=click.IntRange(1, 100000),
    default=16,
    show_default=True,
    help="Connections one client address may hold open on an HTTP endpoint.",
)
@click.option(
    "--gpu-metrics/--no-gpu-metrics",
    envvar="GPU_METRICS",
    default=True,
    show_default=True,
    help="Gather GPU and per-pod telemetry; off, the endpoint serves only probes and counters.",
)
@click.option(
    "--inventory-interval",
    envvar="INVENTORY_INTERVAL",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds between GPU inventory re-reads (MIG mode and layout changes).",
)
@click.option(
    "--metrics-interval",
    envvar="METRICS_INTERVAL",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds between metric snapshots.",
)
@click.option(
    "--proc-root",
    envvar="PROC_ROOT",
    type=click.Path(path_type=Path),
    default=Path("/proc"),
    show_default=True,
    help="Host /proc (for per-pod attribution; needs hostPID).",
)
@click.option(
    "--pod-resources-socket",
    envvar="POD_RESOURCES_SOCKET",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    show_default=True,
)
@click.option(
    "--mps-control",
    envvar="MPS_CONTROL",
    default="nvidia-cuda-mps-control",
    help="Command running the MPS control program.",
)
@click.option(
    "--mps-health-interval",
    envvar="MPS_HEALTH_INTERVAL",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between MPS daemon health checks.",
)
@click.option(
    "--no-compute-mode",
    is_flag=True,
    default=False,
    help="Do not set EXCLUSIVE_PROCESS on MPS GPUs.",
)
@click.option("--kubeconfig", envvar="KUBECONFIG", type=click.Path(path_type=Path), default=None)
@click.option(
    "--memory-guard",
    envvar="MEMORY_GUARD",
    type=click.Choice(["off", "observe", "enforce"]),
    default="observe",
    show_default=True,
    help="Memory guard for time-sliced GPUs (docs/memory-guard.md).",
)
@click.option(
    "--memory-guard-reserve",
    envvar="MEMORY_GUARD_RESERVE",
    default="10%",
    callback=lambda _ctx, _param, value: _reserve(value),
    show_default=True,
    help="Free memory kept per GPU: a percentage, bytes, or a size (4Gi).",
)
@click.option(
    "--memory-guard-grace",
    envvar="MEMORY_GUARD_GRACE",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds pressure must last before a reclaim; also SIGTERM to SIGKILL.",
)
@click.option(
    "--memory-guard-interval",
    envvar="MEMORY_GUARD_INTERVAL",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between memory guard polls.",
)
@click.option(
    "--memory-guard-action",
    envvar="MEMORY_GUARD_ACTION",
    type=click.Choice(["kill", "evict"]),
    default="kill",
    show_default=True,
    help="Signal the container's processes, or evict the pod.",
)
@click.option(
    "--memory-guard-strict/--no-memory-guard-strict",
    envvar="MEMORY_GUARD_STRICT",
    default=False,
    help="Stop any time-sliced pod over its share, even while memory is free.",
)
@click.option(
    "--memory-guard-claim-override",
    envvar="MEMORY_GUARD_CLAIM_OVERRIDE",
    type=click.Choice(["stricter-only", "allow"]),
    default="stricter-only",
    show_default=True,
    help="DRA: may a claim's GuardConfig weaken the guard on a shared GPU (allow)?",
)
@click.option(
    "--memory-soft-limits/--no-memory-soft-limits",
    envvar="MEMORY_SOFT_LIMITS",
    default=True,
    show_default=True,
    help="Pass time-sliced replicas their memory share as env hints.",
)
@click.option(
    "--log-format",
    envvar="LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
)
@click.option(
    "--dra/--no-dra",
    envvar="DRA",
    default=False,
    help="Serve GPUs as a DRA driver instead of device plugins (docs/dra.md).",
)
@click.option(
    "--dra-driver-name",
    envvar="DRA_DRIVER_NAME",
    default=DEFAULT_DRA_DRIVER,
    show_default=True,
    help="DRA driver name (NVIDIA's, so its DeviceClasses and claims work unchanged).",
)
@click.option(
    "--dra-plugin-dir",
    envvar="DRA_PLUGIN_DIR",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory of dra.sock and the checkpoint [default: /var/lib/kubelet/plugins/<driver>].",
)
@click.option(
    "--dra-registry-dir",
    envvar="DRA_REGISTRY_DIR",
    type=click.Path(path_type=Path),
    default=DEFAULT_DRA_REGISTRY_DIR,
    show_default=True,
    help="The kubelet's plugin-watcher directory.",
)
@click.option(
    "--cdi-root",
    envvar="CDI_ROOT",
    type=click.Path(path_type=Path),
    default=DEFAULT_CDI_ROOT,
    show_default=True,
    help="Where per-claim CDI specs are written (DRA mode).",
)
@click.option(
    "--nvidia-smi",
    envvar="NVIDIA_SMI",
    default="nvidia-smi",
    show_default=True,
    help="nvidia-smi command: MPS GPUs' compute mode, claims' time-slice intervals.",
)
@click.option(
    "--dra-resync-interval",
    envvar="DRA_RESYNC_INTERVAL",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Longest wait between retries after a failed ResourceSlice publish (the slices "
    "are watched: nothing is re-read at rest).",
)
@click.option(
    "--consumable-shares",
    envvar="CONSUMABLE_SHARES",
    default="replicas",
    show_default=True,
    help="Which GPUs DRA offers as consumable shares: 'replicas' (those the config shares, "
    "N ways), or NVIDIA's --consumable-shares values for every GPU and MIG device: "
    "'disabled', 'memory', 'unlimited' or a positive integer N (DRA mode).",
)
@click.option(
    "--node-lock-wait",
    envvar="NODE_LOCK_WAIT",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds to wait while another agent holds this node's lock, then exit "
    "[default: wait until it is released].",
)
@click.option("-v", "--verbose", is_flag=True, default=False)
@click.option(
    "--shutdown-grace",
    envvar="GPUSLICE_SHUTDOWN_GRACE",
    type=click.FloatRange(min=0.1),
    default=SHUTDOWN_GRACE_S,
    hidden=True,
    help="Seconds after SIGTERM before a hard exit (tests shorten it).",
)
@click.option(
    "--config-poll-interval",
    envvar="GPUSLICE_CONFIG_POLL_INTERVAL",
    type=click.FloatRange(min=0.05),
    default=1.0,
    hidden=True,
    help="Seconds between checks of the config path for changes (tests shorten it).",
)
@click.pass_context
@reports_errors
def plugin(ctx: click.Context, /, **params: Any) -> None:
    """Run the device plugin daemon on this node."""
    setup_logging(params["log_format"], verbose=params["verbose"])
    plugin_dir: Path = params["device_plugin_path"]
    kubelet_socket: Path | None
    if params["kubelet_socket"] is None:
        kubelet_socket = plugin_dir / "kubelet.sock"
    else:
        kubelet_socket = Path(params["kubelet_socket"]) if params["kubelet_socket"] else None
    settings = AgentSettings(
        node=params["node"],
        config_path=params["config_file"],
        config_name=params["config_name"],
        node_name=params["node_name"],
        node_label=params["node_label"],
        default_config=params["default_config"],
        fallback_strategies=tuple(
            s.strip() for s in params["fallback_strategies"].split(",") if s.strip()
        ),
        overrides=_overrides(ctx, params),
        plugin_dir=plugin_dir,
        kubelet_socket=kubelet_socket,
        disable_healthchecks=os.environ.get("DP_DISABLE_HEALTHCHECKS"),
        enable_healthchecks=os.environ.get("DP_ENABLE_HEALTHCHECKS"),
        labels_file=params["labels_file"],
        labels_mode=_labels_mode(params),
        no_timestamp=params["no_timestamp"],
        namespace=params["namespace"],
        pod_name=os.environ.get("POD_NAME", "").strip(),
        metrics_port=params["metrics_port"],
        metrics_address=params["metrics_address"],
        health_port=params["health_port"],
        http_head_timeout_s=params["http_head_timeout"],
        http_max_per_address=params["http_max_per_address"],
        gpu_metrics=params["gpu_metrics"],
        pod_resources_socket=params["pod_resources_socket"],
        metrics_interval_s=params["metrics_interval"],
        inventory_interval_s=params["inventory_interval"],
        proc_root=params["proc_root"],
        mps_control=tuple(params["mps_control"].split()),
        set_compute_mode=not params["no_compute_mode"],
        nvidia_smi=tuple(params["nvidia_smi"].split()),
        mps_health_interval_s=params["mps_health_interval"],
        kubeconfig=params["kubeconfig"],
        memory_guard=_guard_settings(params),
        reload_interval_s=params["config_poll_interval"],
        node_lock_wait_s=params["node_lock_wait"],
        dra=_dra_settings(params),
    )
    # the watchdog learns from the loop's own selector when the loop waits (agent.watchdog)
    watchdog = LoopWatchdog()
    with asyncio.Runner(loop_factory=watchdog.loop_factory) as runner:
        runner.run(_serve(settings, watchdog, params["shutdown_grace"]))


def _dra_settings(params: dict[str, Any]) -> DraSettings | None:
    if not params["dra"]:
        return None
    if not params["node_name"]:
        raise click.UsageError(
            "--dra needs --node-name (NODE_NAME): the node's name is the pool of its "
            "devices and selects its ResourceSlices, and the driver reads claims from the API"
        )
    return DraSettings(
        driver_name=params["dra_driver_name"],
        plugin_dir=params["dra_plugin_dir"],
        registry_dir=params["dra_registry_dir"],
        cdi_root=params["cdi_root"],
        resync_s=params["dra_resync_interval"],
        consumable_shares=_shares_mode(params["consumable_shares"]),
    )


def _shares_mode(text: str) -> SharesMode:
    """An unknown value stops the daemon before it publishes anything: a typo must not turn
    into devices offered differently than the operator asked."""
    try:
        return SharesMode.parse(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--consumable-shares'") from None


async def _serve(
    settings: AgentSettings, watchdog: LoopWatchdog, grace_s: float = SHUTDOWN_GRACE_S
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # a real signal handler, not loop.add_signal_handler: it must work while the loop is
    # blocked (agent.watchdog says why)
    install_shutdown_signals(loop, stop, grace_s)
    watchdog.start()
    try:
        await _run_agent(settings, stop)
    finally:
        watchdog.stop()


async def _run_agent(settings: AgentSettings, stop: asyncio.Event) -> None:
    # one agent acts on a node at a time: nothing below runs before the lock is held
    async with holding_the_node(settings, stop) as held:
        if held:
            await _run_holding(settings, stop)
        else:
            get_logger("gpuslice").info("stopped", message="while waiting for the node lock")


async def _run_holding(settings: AgentSettings, stop: asyncio.Event) -> None:
    agent: Agent | None = None
    try:
        async with build_agent(settings) as agent:
            await agent.run(stop)
    except (GpusliceError, BackendError) as exc:
        if (agent is not None and agent.started.is_set()) or _fail_on_init_error(settings):
            raise
        # NVIDIA's behaviour with failOnInitError=false: stay up, so a DaemonSet pod on a
        # node without a usable GPU does not crash-loop; the log says why nothing is served.
        get_logger("gpuslice").error(
            "init-failed",
            error=str(exc),
            failOnInitError=False,
            message="waiting indefinitely",
        )
        await stop.wait()
    get_logger("gpuslice").info("stopped")


def _reserve(value: str) -> Reserve:
    try:
        return Reserve.parse(value)
    except GpusliceError as exc:
        raise click.BadParameter(str(exc)) from None


def _guard_settings(params: dict[str, Any]) -> GuardSettings:
    return GuardSettings(
        params=GuardParams(
            mode=params["memory_guard"],
            reserve=params["memory_guard_reserve"],
            grace_s=params["memory_guard_grace"],
            strict=params["memory_guard_strict"],
            lookahead_s=lookahead_for(params["memory_guard_interval"]),
        ),
        interval_s=params["memory_guard_interval"],
        action=params["memory_guard_action"],
        claim_override=params["memory_guard_claim_override"],
        soft_limits=params["memory_soft_limits"],
    )


def _fail_on_init_error(settings: AgentSettings) -> bool:
    try:
        return bool(load_config(settings).config.flags.fail_on_init_error)
    except GpusliceError:
        return True
