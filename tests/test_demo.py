"""`gpuslice demo` replays seed 000 for real: these are the numbers the seed shows."""

from __future__ import annotations

from gpuslice.demo.scenario import run_demo


async def test_seed_000_two_running_two_pending_then_eight_replicas_all_running() -> None:
    result = await run_demo("sim:2xt4")
    registered, deployed, applied, readmitted = result.steps

    assert registered.counts.capacity == {"nvidia.com/gpu": 2}
    assert [p.status for p in deployed.pods] == ["Running", "Running", "Pending", "Pending"]
    assert "Requested: 1, Available: 0" in deployed.pods[2].reason

    assert applied.counts.capacity == {"nvidia.com/gpu": 8}
    assert applied.counts.allocatable == {"nvidia.com/gpu": 8}

    assert [p.status for p in readmitted.pods] == ["Running"] * 4
    gpus = [dict(p.env)["NVIDIA_VISIBLE_DEVICES"] for p in readmitted.pods]
    assert all(g.startswith("GPU-") for g in gpus)
    assert len(set(gpus)) == 2, "replicas collapse to the 2 physical GPUs"
    # the two pods admitted after the change hold replicas, on different GPUs (distributed)
    late = readmitted.pods[2:]
    assert all("::" in p.devices[0] for p in late)
    assert len({dict(p.env)["NVIDIA_VISIBLE_DEVICES"] for p in late}) == 2
