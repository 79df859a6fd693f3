"""Caps in the metrics: protection per GPU, limits and usage per container, the window."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gpuslice.agent.caps import process_cgroups
from gpuslice.core.caps import (
    LIMIT_MAX,
    GpuCapability,
    MemoryLimits,
    caps_view,
)
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.units import MIB
from gpuslice.metrics.caps import caps_families

KEY = ContainerKey("ml", "train", "main")


class _Fixed(Collector):
    def __init__(self, metrics: list[object]) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.metrics)


def exposition(view: object, index: dict[str, int | None]) -> str:
    registry = CollectorRegistry()
    registry.register(_Fixed(caps_families(view, index)))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_protection_limits_usage_and_window() -> None:
    view = caps_view(
        {"GPU-a": GpuCapability("GPU-a"), "GPU-b": GpuCapability("GPU-b", "mig")},
        "enforce",
        {
            (KEY, "GPU-a"): MemoryLimits(4096 * MIB, 4096 * MIB, used_bytes=100 * MIB),
            (ContainerKey("ml", "b", "main"), "GPU-a"): MemoryLimits(MIB, LIMIT_MAX),
        },
        [0.5, 1.5, 3.0],
    )
    text = exposition(view, {"GPU-a": 0, "GPU-b": 1})
    assert (
        'gpuslice_gpu_memory_protection{UUID="GPU-a",gpu="0",protection="capped",reason=""} 1.0'
        in text
    )
    assert (
        'protection="guarded",reason="MIG mode: NVML does not set memory limits on MIG devices"'
        in text
    )
    train = '{UUID="GPU-a",container="main",gpu="0",namespace="ml",pod="train"}'
    assert f"gpuslice_pod_memory_soft_limit_bytes{train} 4.294967296e+09" in text
    assert (
        'gpuslice_pod_memory_hard_limit_bytes{UUID="GPU-a",container="main",gpu="0",namespace="ml",pod="b"}'
        not in text
    )
    assert f"gpuslice_pod_memory_capped_used_bytes{train} 1.048576e+08" in text
    assert 'gpuslice_memory_caps_window_seconds{quantile="1"} 3.0' in text


def test_a_node_without_caps_exports_only_the_protection() -> None:
    view = caps_view({"GPU-a": GpuCapability("GPU-a", "driver-without-call")}, "off", {})
    text = exposition(view, {"GPU-a": 0})
    assert 'protection="none"' in text
    assert "gpuslice_pod_memory_soft_limit_bytes{" not in text
    assert "gpuslice_memory_caps_window_seconds{" not in text


def test_process_cgroups_reads_the_v2_line(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = tmp_path / "proc"
    scope = "kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope"
    (root / scope).mkdir(parents=True)
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text(f"0::/{scope}\n")
    (proc / "8").mkdir()
    (proc / "8" / "cgroup").write_text("12:memory:/kubepods/pod1/ab\n")  # cgroup v1: no path
    got = process_cgroups(root, proc, {KEY: [99, 7], ContainerKey("a", "b", "c"): [8]})
    assert got == {KEY: str(root / scope)}


def test_process_cgroups_reads_a_line_relative_to_the_agents_cgroup_namespace(
    tmp_path: Path,
) -> None:
    """Read from the agent's pod (its own cgroup namespace), a process's line climbs out of
    that namespace (`0::/../../kubepods-...`): no root joins it to a path. The pod UID and
    container ID in it lead to the cgroup under the host's tree all the same."""
    uid = "11111111-2222-4333-8444-000000000001"
    cid = "ab" * 32
    scope = (
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}"
        f".slice/cri-containerd-{cid}.scope"
    )
    root = tmp_path / "host-cgroup"
    (root / scope).mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text(
        f"0::/../../kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{cid}.scope\n"
    )
    assert process_cgroups(root, proc, {KEY: [7]}) == {KEY: str(root / scope)}
