"""The pure decisions of memory caps: which GPUs get them, which limits each tenant gets,
what the toolkit's hook is given."""

from __future__ import annotations

import pytest

from gpuslice.core.attribution import Entitlement
from gpuslice.core.caps import (
    CLEARED,
    LIMIT_MAX,
    GpuCapability,
    MemoryLimits,
    NodeCapability,
    check_outcome,
    gpu_capability,
    limits_for,
    protection,
)
from gpuslice.core.cdi.hook import CapsRequestError, hook_entry, hook_env
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB

GIB = 1024 * MIB
ABLE = NodeCapability(cgroup_v2=True, root=True)


def cap(**kw: object) -> str | None:
    args: dict[str, object] = {
        "mode": "auto",
        "mig_enabled": False,
        "memory_reported": True,
        "driver_has_call": True,
        "node": ABLE,
    }
    args.update(kw)
    return gpu_capability("GPU-a", **args).refusal  # type: ignore[arg-type]


def test_a_capable_gpu_has_no_refusal_and_is_capped() -> None:
    c = gpu_capability(
        "GPU-a", mode="auto", mig_enabled=False, memory_reported=True, driver_has_call=True,
        node=ABLE,
    )  # fmt: skip
    assert c.capable
    assert c.reason == ""
    assert protection(c, "observe") == "capped"
    assert protection(c, "off") == "capped"


@pytest.mark.parametrize(
    ("kw", "refusal"),
    [
        ({"mode": "off"}, "caps-off"),
        ({"mig_enabled": True}, "mig"),
        ({"memory_reported": False}, "unified-memory"),
        ({"driver_has_call": False}, "driver-without-call"),
        ({"node": NodeCapability(cgroup_v2=False, root=True)}, "cgroup-v1"),
        ({"node": NodeCapability(cgroup_v2=True, root=False)}, "not-root"),
        # one reason only, the GPU's own before the node's
        ({"mig_enabled": True, "node": NodeCapability(cgroup_v2=False, root=False)}, "mig"),
        ({"driver_has_call": False, "node": NodeCapability(False, True)}, "driver-without-call"),
    ],
)
def test_each_refusal_is_one_named_reason(kw: dict[str, object], refusal: str) -> None:
    assert cap(**kw) == refusal


def test_an_uncapped_gpu_is_guarded_only_while_the_guard_enforces() -> None:
    refused = gpu_capability(
        "GPU-a", mode="auto", mig_enabled=True, memory_reported=True, driver_has_call=True,
        node=ABLE,
    )  # fmt: skip
    assert "MIG" in refused.reason
    assert protection(refused, "enforce") == "guarded"
    assert protection(refused, "observe") == "none"  # observing stops nobody
    assert protection(refused, "off") == "none"
    assert protection(None, "off") == "none"


def test_time_sliced_tenants_get_soft_share_and_hard_by_policy() -> None:
    share = Entitlement(SharingStrategy.TIME_SLICING, 12 * GIB, 0.25)
    assert limits_for(share, 48 * GIB, "strict") == MemoryLimits(12 * GIB, 12 * GIB)
    assert limits_for(share, 48 * GIB, "borrow") == MemoryLimits(12 * GIB, 48 * GIB)


@pytest.mark.parametrize("kind", [SharingStrategy.NONE, SharingStrategy.MPS, SharingStrategy.MIG])
def test_only_time_sliced_tenants_are_capped(kind: SharingStrategy) -> None:
    assert limits_for(Entitlement(kind, 12 * GIB, 0.25), 48 * GIB, "strict") is None


def test_a_gpu_without_memory_figure_caps_nobody() -> None:
    assert limits_for(Entitlement(SharingStrategy.TIME_SLICING, 0, 0.5), 0, "strict") is None


def test_soft_never_above_the_gpu() -> None:
    got = limits_for(Entitlement(SharingStrategy.TIME_SLICING, 60 * GIB, 1.0), 48 * GIB, "strict")
    assert got == MemoryLimits(48 * GIB, 48 * GIB)


def test_hook_env_is_integer_mib_rounded_down() -> None:
    env = hook_env(MemoryLimits(11517 * MIB + 5, 46068 * MIB + MIB - 1))
    assert env == {"NVIDIA_GPU_MEMORY_REQUEST": "11517", "NVIDIA_GPU_MEMORY_LIMIT": "46068"}


def test_hook_env_refuses_a_request_above_the_limit() -> None:
    with pytest.raises(CapsRequestError, match="above the limit"):
        hook_env(MemoryLimits(2 * GIB, GIB))


def test_hook_entry_follows_the_toolkit_arguments() -> None:
    h = hook_entry("/usr/bin/nvidia-cdi-hook", ["GPU-a", "GPU-b"], "/run/nvidia/driver")
    assert h == {
        "hookName": "createRuntime",
        "path": "/usr/bin/nvidia-cdi-hook",
        "args": [
            "nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/run/nvidia/driver",
            "--gpu-id", "GPU-a", "--gpu-id", "GPU-b",
        ],
    }  # fmt: skip
    ctk = hook_entry("/usr/local/bin/nvidia-ctk", ["GPU-a"])
    assert ctk["args"] == [
        "nvidia-ctk", "hook", "apply-cuda-memory-limits", "--driver-root", "", "--gpu-id", "GPU-a"
    ]  # fmt: skip


def test_check_outcome() -> None:
    want = MemoryLimits(GIB, 2 * GIB)
    assert check_outcome(want, MemoryLimits(GIB, 2 * GIB, used_bytes=5)) == "ok"
    assert check_outcome(want, None) == "set"
    assert check_outcome(want, CLEARED) == "set"
    # above gpuslice's (no hard limit at all, or a tenant's own): told as raised
    assert check_outcome(want, MemoryLimits(GIB, LIMIT_MAX)) == "raised"
    assert check_outcome(want, MemoryLimits(2 * GIB, 2 * GIB)) == "raised"
    assert check_outcome(want, MemoryLimits(GIB, GIB)) == "repaired"
    assert CLEARED.cleared
    assert str(CLEARED) == "soft 0MiB hard max"


def test_describe_says_each_gpus_protection() -> None:
    from gpuslice.backends.simulated.node import build_inventory
    from gpuslice.backends.simulated.nodespec import parse_spec
    from gpuslice.core.caps import caps_view
    from gpuslice.core.config import parse_config
    from gpuslice.core.describe import describe, report_to_dict
    from gpuslice.core.sharing.plan import build_plan

    inv = build_inventory(parse_spec("1xl40s,1xa100-40gb/mig=3g.20gb*2"))
    l40s, a100 = (g.uuid for g in inv.gpus)
    caps: dict[str, GpuCapability] = {
        l40s: gpu_capability(l40s, mode="auto", mig_enabled=False, memory_reported=True,
                             driver_has_call=True, node=ABLE),
        a100: gpu_capability(a100, mode="auto", mig_enabled=True, memory_reported=True,
                             driver_has_call=True, node=ABLE),
    }  # fmt: skip
    view = caps_view(caps, "enforce", {})
    report = describe(build_plan(inv, parse_config("")), inv, view.protection)
    devices = report_to_dict(report)["devices"]
    assert [(d["memory_protection"], d["memory_protection_reason"]) for d in devices] == [  # type: ignore[attr-defined]
        ("capped", None),
        ("guarded", "MIG mode: NVML does not set memory limits on MIG devices"),
    ]
