"""`gpuslice plugin`'s options are generated from the settings' knobs (`agent.knobs`): the
flags and environment variables are the ones the hand-written command had (main at eb516ae,
before issue 31), so DaemonSet manifests and scripts keep working, and each knob's default
is its field's."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.agent.knobs import knobs
from gpuslice.agent.settings import (
    AgentSettings,
    CapsSettings,
    ConfigFlags,
    DraSettings,
    GuardSettings,
)
from gpuslice.cli.plugin import FIELDS, GROUPS, plugin, settings_from_cli

FLAGS_BEFORE = {
    "--cdi-annotation-prefix",
    "--cdi-root",
    "--config-file",
    "--config-name",
    "--config-poll-interval",
    "--consumable-shares",
    "--container-driver-root",
    "--default-config",
    "--dev-root",
    "--device-discovery-strategy",
    "--device-id-strategy",
    "--device-list-strategy",
    "--device-plugin-path",
    "--dra",
    "--dra-driver-name",
    "--dra-plugin-dir",
    "--dra-registry-dir",
    "--dra-resync-interval",
    "--driver-root",
    "--fail-on-init-error",
    "--fallback-strategies",
    "--gdrcopy-enabled",
    "--gds-enabled",
    "--gpu-metrics",
    "--health-port",
    "--http-head-timeout",
    "--http-max-per-address",
    "--inventory-interval",
    "--kubeconfig",
    "--kubelet-socket",
    "--labels-file",
    "--labels-mode",
    "--log-format",
    "--memory-guard",
    "--memory-guard-action",
    "--memory-guard-claim-override",
    "--memory-guard-grace",
    "--memory-guard-interval",
    "--memory-guard-reserve",
    "--memory-guard-strict",
    "--memory-soft-limits",
    "--metrics-address",
    "--metrics-interval",
    "--metrics-port",
    "--mig-strategy",
    "--mofed-enabled",
    "--mps-control",
    "--mps-health-interval",
    "--mps-root",
    "--namespace",
    "--no-compute-mode",
    "--no-dra",
    "--no-fail-on-init-error",
    "--no-gdrcopy-enabled",
    "--no-gds-enabled",
    "--no-gpu-metrics",
    "--no-labels",
    "--no-memory-guard-strict",
    "--no-memory-soft-limits",
    "--no-mofed-enabled",
    "--no-pass-device-specs",
    "--no-timestamp",
    "--node",
    "--node-label",
    "--node-lock-wait",
    "--node-name",
    "--nvidia-dev-root",
    "--nvidia-driver-root",
    "--nvidia-smi",
    "--pass-device-specs",
    "--pod-resources-socket",
    "--proc-root",
    "--shared-devices-allocation-policy",
    "--shutdown-grace",
    "--verbose",
    "-v",
}

ENV_BEFORE = {
    "CDI_ANNOTATION_PREFIX",
    "CDI_ROOT",
    "CONFIG_FILE",
    "CONFIG_NAME",
    "CONSUMABLE_SHARES",
    "CONTAINER_DRIVER_ROOT",
    "DEFAULT_CONFIG",
    "DEVICE_DISCOVERY_STRATEGY",
    "DEVICE_ID_STRATEGY",
    "DEVICE_LIST_STRATEGY",
    "DEVICE_PLUGIN_PATH",
    "DRA",
    "DRA_DRIVER_NAME",
    "DRA_PLUGIN_DIR",
    "DRA_REGISTRY_DIR",
    "DRA_RESYNC_INTERVAL",
    "FAIL_ON_INIT_ERROR",
    "FALLBACK_STRATEGIES",
    "GDRCOPY_ENABLED",
    "GDS_ENABLED",
    "GFD_NO_TIMESTAMP",
    "GFD_OUTPUT_FILE",
    "GPUSLICE_CONFIG_POLL_INTERVAL",
    "GPUSLICE_NODE",
    "GPUSLICE_SHUTDOWN_GRACE",
    "GPU_METRICS",
    "HEALTH_PORT",
    "HTTP_HEAD_TIMEOUT",
    "HTTP_MAX_PER_ADDRESS",
    "INVENTORY_INTERVAL",
    "KUBECONFIG",
    "KUBELET_SOCKET",
    "LABELS_MODE",
    "LOG_FORMAT",
    "MEMORY_GUARD",
    "MEMORY_GUARD_ACTION",
    "MEMORY_GUARD_CLAIM_OVERRIDE",
    "MEMORY_GUARD_GRACE",
    "MEMORY_GUARD_INTERVAL",
    "MEMORY_GUARD_RESERVE",
    "MEMORY_GUARD_STRICT",
    "MEMORY_SOFT_LIMITS",
    "METRICS_ADDRESS",
    "METRICS_INTERVAL",
    "METRICS_PORT",
    "MIG_STRATEGY",
    "MOFED_ENABLED",
    "MPS_CONTROL",
    "MPS_HEALTH_INTERVAL",
    "MPS_ROOT",
    "NAMESPACE",
    "NODE_LABEL",
    "NODE_LOCK_WAIT",
    "NODE_NAME",
    "NVIDIA_DEV_ROOT",
    "NVIDIA_DRIVER_ROOT",
    "NVIDIA_SMI",
    "PASS_DEVICE_SPECS",
    "POD_RESOURCES_SOCKET",
    "PROC_ROOT",
    "SHARED_DEVICES_ALLOCATION_POLICY",
}


FLAGS_ADDED = {
    "--memory-caps",
    "--memory-caps-policy",
    "--memory-caps-hook-path",
    "--cgroup-root",
    "--memory-caps-hook-seen-at",
}
"""Since: memory caps (issue 32); where the agent sees the hook program (issue 40)."""
FLAGS_ADDED |= {"--mps-shm-tmpfs", "--no-mps-shm-tmpfs"}
"""Since: the MPS shm tmpfs (issue 41)."""
ENV_ADDED = {
    "MEMORY_CAPS",
    "MEMORY_CAPS_POLICY",
    "MEMORY_CAPS_HOOK_PATH",
    "CGROUP_ROOT",
    "MEMORY_CAPS_HOOK_SEEN_AT",
}
ENV_ADDED |= {"MPS_SHM_TMPFS"}


def test_the_flags_and_variables_are_those_of_the_hand_written_command() -> None:
    flags = {f for p in plugin.params for f in (*p.opts, *p.secondary_opts)}
    envs = {str(p.envvar) for p in plugin.params if p.envvar}
    assert flags == FLAGS_BEFORE | FLAGS_ADDED
    assert envs == ENV_BEFORE | ENV_ADDED


COMPOSED = {"overrides", "memory_guard", "memory_caps", "dra"}
"""Built from other knobs' groups (`ConfigFlags`, `GuardSettings`, `DraSettings`)."""
TUNED_BY_CODE = {"config_rescan_s", "health_poll_s", "initial_label_wait_s"}
"""Timings the daemon never took as flags (tests and the demo shorten them)."""


def test_every_setting_is_a_knob_or_says_why_not() -> None:
    for group in (AgentSettings, GuardSettings, CapsSettings, DraSettings):
        plain = {f.name for f in group.__dataclass_fields__.values()} - {
            k.name for k in knobs(group)
        }
        assert plain <= COMPOSED | TUNED_BY_CODE, (group.__name__, plain)


def test_no_flags_give_the_fields_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """One default per setting: the command with nothing set gives the dataclass's."""
    for group in GROUPS:
        for f, _option in FIELDS[group]:
            if f.knob.env:
                monkeypatch.delenv(f.knob.env, raising=False)
    ctx = plugin.make_context("plugin", [])
    settings, daemon = settings_from_cli(ctx)
    assert settings == AgentSettings()
    assert daemon.shutdown_grace_s == 20.0


def test_variables_without_flags_are_read_through_their_knobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAME", " agent-x \n")
    monkeypatch.setenv("DP_DISABLE_HEALTHCHECKS", "xids")
    monkeypatch.delenv("DP_ENABLE_HEALTHCHECKS", raising=False)
    monkeypatch.setenv("POD_UID", " 0f3c2a4e-8b1d \n")
    monkeypatch.setenv("GPUSLICE_SIM_CONTROL_DIR", "/run/ctl")
    settings, _ = settings_from_cli(plugin.make_context("plugin", []))
    assert settings.pod_name == "agent-x"
    assert settings.disable_healthchecks == "xids"
    assert settings.enable_healthchecks is None
    assert settings.pod_uid == "0f3c2a4e-8b1d"
    assert settings.sim_control_dir == Path("/run/ctl")
    monkeypatch.setenv("GPUSLICE_SIM_CONTROL_DIR", "")
    assert settings_from_cli(plugin.make_context("plugin", []))[0].sim_control_dir is None


def test_the_kubelet_socket_defaults_under_the_plugin_directory(tmp_path: Path) -> None:
    ctx = plugin.make_context("plugin", ["--device-plugin-path", str(tmp_path)])
    settings, _ = settings_from_cli(ctx)
    assert settings.kubelet_socket == tmp_path / "kubelet.sock"
    ctx = plugin.make_context("plugin", ["--kubelet-socket", ""])
    assert settings_from_cli(ctx)[0].kubelet_socket is None


def test_set_flags_override_the_config_and_defaults_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for f, _option in FIELDS[ConfigFlags]:
        monkeypatch.delenv(str(f.knob.env), raising=False)
    ctx = plugin.make_context(
        "plugin", ["--mig-strategy", "mixed", "--device-list-strategy", "envvar, cdi-cri"]
    )
    settings, _ = settings_from_cli(ctx)
    assert settings.overrides == {
        "flags.migStrategy": "mixed",
        "flags.plugin.deviceListStrategy": ["envvar", "cdi-cri"],
    }
