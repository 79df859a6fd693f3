"""`/status`'s PodResources reachability, from what the snapshot says."""

from __future__ import annotations

from dataclasses import replace

from gpuslice.core.attribution import Attribution, ContainerGpuUsage, Entitlement
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.metrics.snapshot import MetricsSnapshot
from gpuslice.metrics.status import build_status


def snapshot(problems: tuple[str, ...]) -> MetricsSnapshot:
    empty = Attribution(usages=(), unattributed=(), unknown_device_ids=(), learned_pods={})
    return MetricsSnapshot(
        taken_at=1.0,
        hostname="n1",
        gpus=(),
        attribution=empty,
        advertised={},
        allocated={},
        problems=problems,
    )


def status(problems: tuple[str, ...], present: bool = True) -> dict[str, object]:
    return build_status(
        node_name="n1",
        config_name="a100",
        plan=None,
        snapshot=snapshot(problems),
        gpu_metrics=True,
        pod_resources_socket="/pr.sock",
        pod_resources_present=present,
        ready=(False, "not registered\n"),
    )


def test_pod_resources_states() -> None:
    assert status(())["pod_resources"] == {"state": "ok", "detail": "/pr.sock"}
    down = status(("pod assignments unavailable, using the last list: refused",))
    assert down["pod_resources"] == {
        "state": "unreachable",
        "detail": "pod assignments unavailable, using the last list: refused",
    }
    assert down["warnings"] == ["pod assignments unavailable, using the last list: refused"]
    assert status((), present=False)["pod_resources"] == {
        "state": "missing",
        "detail": "no socket at /pr.sock",
    }


def test_status_carries_config_and_readiness() -> None:
    doc = status(())
    assert (doc["node_name"], doc["config_name"]) == ("n1", "a100")
    assert (doc["ready"], doc["ready_reason"]) == (False, "not registered")


def test_a_pods_sharing_is_spelled_as_before_exclusive_for_an_unshared_gpu() -> None:
    """`/status` (and `gpuslice top`, which reads it) names a holder's kind as it always
    has: `exclusive` for a whole GPU nobody shares, where the plan's strategy says `none`."""
    usages = tuple(
        ContainerGpuUsage(
            "ml",
            f"p{i}",
            "main",
            "GPU-0",
            0,
            ("nvidia.com/gpu",),
            (f"d{i}",),
            ("GPU-0",),
            Entitlement(kind, 1024, 1.0),
            512,
            None,
            (),
        )
        for i, kind in enumerate(SharingStrategy)
    )
    attribution = Attribution(usages, unattributed=(), unknown_device_ids=(), learned_pods={})
    doc = build_status(
        node_name="n1",
        config_name=None,
        plan=None,
        snapshot=replace(snapshot(()), attribution=attribution),
        gpu_metrics=True,
        pod_resources_socket="/pr.sock",
        pod_resources_present=True,
        ready=(True, ""),
    )
    pods = doc["pods"]
    assert [p["sharing"] for p in pods] == ["exclusive", "time-slicing", "mps", "mig"]
