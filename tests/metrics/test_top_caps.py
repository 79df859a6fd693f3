"""`gpuslice top`'s tables show what caps hold (issue 40 item 8): per container the soft and
hard limits read back beside the memory used, or why it is not capped; per GPU why it is
not capped."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpuslice.core.jsontypes import Json
from gpuslice.metrics.top import render_status

MIB = 1024 * 1024


def _pod(name: str, **caps: Any) -> Json:
    return {
        "namespace": "ml", "pod": name, "container": "main", "gpu_index": 0,
        "gpu_uuid": "GPU-a", "resources": ["nvidia.com/gpu"], "claims": [],
        "sharing": "time-slicing", "memory_used_bytes": 9000 * MIB,
        "memory_entitled_bytes": 11517 * MIB, "memory_share_used": 0.78, "over_share": False,
        "sm_util_percent": None, "sm_share": 0.25, "pids": [7],
        "memory_soft_limit_bytes": None, "memory_hard_limit_bytes": None,
        "memory_capped": False, "memory_capped_used_bytes": None, "memory_caps_reason": None,
        **caps,
    }  # fmt: skip


def _text(doc: Json) -> str:
    console = Console(width=250, record=True, color_system=None)
    console.print(render_status(doc, now=0.0))
    return console.export_text()


def _gpu(protection: str, reason: str | None) -> Json:
    return {
        "index": 0, "uuid": "GPU-a", "model": "NVIDIA L40S", "memory_total_mib": 46068,
        "memory_used_mib": 15000, "gpu_util_percent": 10, "temperature_c": 40,
        "power_w": 100.0, "last_xid": None, "memory_protection": protection,
        "memory_protection_reason": reason,
    }  # fmt: skip


def test_soft_hard_and_used_per_container_and_why_one_is_not_capped() -> None:
    waiting = "its cgroup was not found under /sys/fs/cgroup"
    doc = {
        "node_name": "n",
        "gpus": [_gpu("guarded", f"a container is not capped: {waiting}")],
        "pods": [
            _pod(
                "capped",
                memory_capped=True,
                memory_soft_limit_bytes=11517 * MIB,
                memory_hard_limit_bytes=11517 * MIB,
                memory_capped_used_bytes=9000 * MIB,
            ),
            _pod("late", memory_caps_reason=waiting),
        ],
    }
    text = _text(doc)
    assert "SOFT" in text
    assert "HARD" in text
    assert "MEMORY USED" in text
    [capped] = [ln for ln in text.splitlines() if "ml/capped" in ln]
    assert capped.count("11517 MiB") == 3  # entitled, soft, hard
    assert "9000 MiB" in capped
    assert "capped" in capped.split("ml/capped", 1)[1]
    [late] = [ln for ln in text.splitlines() if "ml/late" in ln]
    assert "not capped" in late
    assert f"guarded (not capped: a container is not capped: {waiting[:20]}" in " ".join(
        text.split()
    )


def test_a_gpu_protected_by_nothing_says_why_it_is_not_capped() -> None:
    reason = "the driver has no nvmlDeviceSetMemoryLimits_v1 (needs r615+)"
    text = " ".join(_text({"node_name": "n", "gpus": [_gpu("none", reason)], "pods": []}).split())
    assert f"none (not capped: {reason})" in text
