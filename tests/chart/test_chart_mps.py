"""MPS on (`mps.enabled`, or a config in `config.map` with `sharing.mps`): the agent is
replaced without a surge, as in DRA mode. The MPS control daemon outlives the agent and the
next agent takes it over (docs/install.md, "MPS"); two agents on one node would both
supervise it.

Rendered through scripts/check-chart like the other chart tests."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import one, render
from tests.chart.test_chart_dra import render_notes

MPS_CONFIG = (
    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
TS_CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


def surge(value: Any) -> Json:
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": value, "maxUnavailable": 0}}


def refused_for_mps(result: Any, value: Any, why: str) -> bool:
    prefix = f"chart validation: updateStrategy.rollingUpdate.maxSurge={value} with MPS on ({why})"
    return not result.ok and any(p.startswith(prefix) for p in result.problems)


@pytest.mark.parametrize("value", [1, "25%"])
def test_a_surge_is_refused_with_mps_enabled(value: Any) -> None:
    result = render(mps={"enabled": True}, updateStrategy=surge(value))
    assert refused_for_mps(result, value, "mps.enabled"), result.problems


def test_a_surge_is_refused_with_an_mps_config_in_the_map() -> None:
    result = render(
        config={"map": {"default": TS_CONFIG, "mps": MPS_CONFIG}, "default": "default"},
        updateStrategy=surge(1),
    )
    assert refused_for_mps(result, 1, "a config in config.map with sharing.mps"), result.problems


def test_a_surge_without_mps_is_the_users_choice() -> None:
    result = render(config={"map": {"any": TS_CONFIG}, "default": "any"}, updateStrategy=surge(1))
    assert result.ok, result.problems
    rolling = one(result, "DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"]
    assert rolling["maxSurge"] == 1


def test_mps_pins_max_surge_zero_and_keeps_the_rest() -> None:
    result = render(mps={"enabled": True})
    assert result.ok, result.problems
    strategy = one(result, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}}
    kept = render(
        mps={"enabled": True},
        updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
    )
    assert kept.ok, kept.problems
    assert one(kept, "DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": "10%",
        "maxSurge": 0,
    }
    for zero in (0, "0%"):
        assert render(mps={"enabled": True}, updateStrategy=surge(zero)).ok
    on_delete = render(mps={"enabled": True}, updateStrategy={"type": "OnDelete"})
    assert on_delete.ok, on_delete.problems
    assert one(on_delete, "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_nvidias_mps_values_get_what_mps_needs_and_the_notes_say_why() -> None:
    """NVIDIA's chart starts the MPS daemon from the config alone, so NVIDIA's values files
    carry MPS in `config.map` and never set `mps.enabled`: the agent still gets the
    privilege and the host PID namespace the daemon needs, and NOTES names the configs
    instead of saying "not privileged"."""
    values: Json = {
        "config": {"map": {"default": TS_CONFIG, "mps-4": MPS_CONFIG}, "default": "default"}
    }
    result = render(**values)
    assert result.ok, result.problems
    pod = one(result, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["containers"][0]["securityContext"]["privileged"] is True
    notes = " ".join(render_notes(**values).split())
    assert "not privileged" not in notes
    assert "privileged container: config.map uses sharing.mps (mps-4)" in notes
    assert (
        "mps.enableHostPID (the MPS control daemon: config.map uses sharing.mps (mps-4))" in notes
    )
    without_host_pid = render(**values, mps={"enableHostPID": False})
    assert one(without_host_pid, "DaemonSet")["spec"]["template"]["spec"]["hostPID"] is False

    time_sliced: Json = {"config": {"map": {"default": TS_CONFIG}, "default": "default"}}
    pod = one(render(**time_sliced), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is False
    assert pod["containers"][0]["securityContext"]["privileged"] is False


def _propagation(result: Any, volume: str) -> str | None:
    [container] = one(result, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume]
    propagation: str | None = mount.get("mountPropagation")
    return propagation


@pytest.mark.parametrize(("dra", "volume"), [(False, "mps-root"), (True, "dra-plugin")])
def test_with_mps_the_shm_tmpfs_reaches_the_host(dra: bool, volume: str) -> None:
    """The agent mounts each MPS daemon's shm directory as a size-limited tmpfs (issue 41):
    the mount must propagate back to the host for the runtime to bind it into the pods, which
    takes Bidirectional propagation, allowed privileged containers only (mps.enabled)."""
    on = render(mps={"enabled": True}, dra={"enabled": dra})
    assert on.ok, on.problems
    assert _propagation(on, volume) == "Bidirectional"
    off = render(dra={"enabled": dra})
    assert off.ok, off.problems
    assert _propagation(off, volume) is None
