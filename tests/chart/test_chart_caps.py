"""The chart turns memory caps on (issue 40 item 1): `memoryCaps` values the schema takes,
the variables the agent reads, the host's cgroup tree mounted at its own path with
`CGROUP_ROOT` naming it, CAP_SYS_ADMIN for the driver's limits calls, the toolkit hook's
host directory in DRA mode, and the PodResources socket and the pod list wherever caps or
the guard need them, not only with metrics. Off by default: nothing granted."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import container_of, env_of, one
from tests.chart.chart_support import render as render_any

CAPS = {"memoryCaps": {"mode": "auto"}}
PODS_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}


def render(**values: Any) -> Any:
    result = render_any(**values)
    assert result.ok, result.problems
    return result


def _pod(result: Any) -> Json:
    return dict(one(result, "DaemonSet")["spec"]["template"]["spec"])


def _mount(pod: Json, name: str) -> tuple[Json, Json] | None:
    volumes = [v for v in pod["volumes"] if v["name"] == name]
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == name]
    if not volumes and not mounts:
        return None
    [volume], [mount] = volumes, mounts
    return volume, mount


def test_off_by_default_nothing_granted() -> None:
    result = render()
    env = env_of(one(result, "DaemonSet"))
    assert env["MEMORY_CAPS"] == "off"
    assert "CGROUP_ROOT" not in env
    pod = _pod(result)
    assert _mount(pod, "host-cgroup") is None
    assert container_of(result)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_caps_mount_the_hosts_cgroup_tree_at_its_own_path() -> None:
    result = render(**CAPS)
    env = env_of(one(result, "DaemonSet"))
    assert env["MEMORY_CAPS"] == "auto"
    assert env["MEMORY_CAPS_POLICY"] == "strict"
    assert env["CGROUP_ROOT"] == "/sys/fs/cgroup"
    assert env["MEMORY_CAPS_HOOK_PATH"] == "/usr/bin/nvidia-cdi-hook"
    assert "MEMORY_CAPS_HOOK_SEEN_AT" not in env  # no CDI spec of gpuslice's to write
    found = _mount(_pod(result), "host-cgroup")
    assert found is not None
    volume, mount = found
    assert volume["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    assert mount == {"name": "host-cgroup", "mountPath": "/sys/fs/cgroup", "readOnly": True}
    context = container_of(result)["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert context["privileged"] is False

    moved = render(memoryCaps={"mode": "auto", "cgroupRoot": "/host/cgroup", "policy": "borrow"})
    env = env_of(one(moved, "DaemonSet"))
    assert (env["CGROUP_ROOT"], env["MEMORY_CAPS_POLICY"]) == ("/host/cgroup", "borrow")
    found = _mount(_pod(moved), "host-cgroup")
    assert found is not None
    assert found[0]["hostPath"]["path"] == found[1]["mountPath"] == "/host/cgroup"


def test_with_the_guard_killing_both_capabilities_are_added() -> None:
    result = render(memoryGuard={"mode": "enforce", "action": "kill"}, **CAPS)
    caps = container_of(result)["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["KILL", "SYS_ADMIN"]}


def test_dra_mounts_the_hooks_directory_and_names_where_the_agent_sees_it() -> None:
    result = render(dra={"enabled": True}, **CAPS)
    env = env_of(one(result, "DaemonSet"))
    assert env["MEMORY_CAPS_HOOK_PATH"] == "/usr/bin/nvidia-cdi-hook"  # what the spec runs
    assert env["MEMORY_CAPS_HOOK_SEEN_AT"] == "/host-hook/nvidia-cdi-hook"
    found = _mount(_pod(result), "caps-hook")
    assert found is not None
    volume, mount = found
    assert volume["hostPath"] == {"path": "/usr/bin", "type": "DirectoryOrCreate"}
    assert mount == {"name": "caps-hook", "mountPath": "/host-hook", "readOnly": True}

    none = render(dra={"enabled": True}, memoryCaps={"mode": "auto", "hookPath": ""})
    assert _mount(_pod(none), "caps-hook") is None
    assert "MEMORY_CAPS_HOOK_SEEN_AT" not in env_of(one(none, "DaemonSet"))


def test_dra_mounts_the_hook_for_the_base_spec_with_caps_off() -> None:
    """The base CDI spec's library hooks run the program whatever the caps mode."""
    result = render(dra={"enabled": True})
    env = env_of(one(result, "DaemonSet"))
    assert env["MEMORY_CAPS"] == "off"
    assert env["MEMORY_CAPS_HOOK_SEEN_AT"] == "/host-hook/nvidia-cdi-hook"
    assert _mount(_pod(result), "caps-hook") is not None
    assert _mount(_pod(result), "host-cgroup") is None
    assert container_of(result)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(
    "values",
    [
        {"metrics": {"enabled": False}, "memoryGuard": {"mode": "enforce"}},
        {"metrics": {"enabled": False}, "memoryGuard": {"mode": "off"}, **CAPS},
    ],
    ids=["guard", "caps"],
)
def test_pod_resources_and_the_pod_list_wherever_the_guard_or_caps_need_them(
    values: Json,
) -> None:
    result = render(**values)
    found = _mount(_pod(result), "pod-resources")
    assert found is not None, "the guard and caps read which pod holds which GPU"
    assert found[1]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert PODS_RULE in one(result, "ClusterRole")["rules"]
    nobody = render(metrics={"enabled": False}, memoryGuard={"mode": "off"})
    assert _mount(_pod(nobody), "pod-resources") is None


@pytest.mark.parametrize(
    "caps",
    [{"mode": "on"}, {"mode": "auto", "cgroupRoot": "sys/fs/cgroup"}, {"hookpath": "/x"}],
    ids=["mode", "relative-root", "typo"],
)
def test_the_schema_takes_caps_values_and_refuses_bad_ones(caps: Json) -> None:
    good = {"mode": "off", "policy": "borrow", "hookPath": "", "cgroupRoot": "/sys/fs/cgroup"}
    render(memoryCaps=good)
    result = render_any(memoryCaps=caps)
    assert not result.ok
    assert any("memoryCaps" in p for p in result.problems), result.problems
