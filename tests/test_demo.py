"""`gpuslice demo` runs the real agent against an emulated kubelet: pods that do not fit
wait as the scheduler says, NVIDIA's config shares the GPUs live, then one pod on a shared
GPU leaks and the demo shows NVIDIA's outcome beside gpuslice's."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.demo.scenario import run_demo

SEEDS = Path(__file__).parent / "configs" / "seeds"


async def test_two_pods_wait_as_the_scheduler_says_then_time_slicing_runs_all_four() -> None:
    result = await run_demo("sim:2xt4")
    registered, deployed, applied, bound = result.steps

    assert registered.counts.capacity == {"nvidia.com/gpu": 2}
    assert [p.status for p in deployed.pods] == ["Running", "Running", "Pending", "Pending"]
    # kube-scheduler's words: a pod that does not fit is never sent to the kubelet
    assert deployed.pods[2].reason == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    assert "Allocate" not in deployed.pods[2].reason

    assert applied.counts.capacity == {"nvidia.com/gpu": 8}
    assert applied.counts.allocatable == {"nvidia.com/gpu": 8}

    assert bound.title == "the scheduler binds the pending pods"
    assert [p.status for p in bound.pods] == ["Running"] * 4
    gpus = [dict(p.env)["NVIDIA_VISIBLE_DEVICES"] for p in bound.pods]
    assert all(g.startswith("GPU-") for g in gpus)
    assert len(set(gpus)) == 2, "replicas collapse to the 2 physical GPUs"
    # the two pods bound after the change hold replicas, on different GPUs (distributed)
    late = bound.pods[2:]
    assert all("::" in p.devices[0] for p in late)
    assert len({dict(p.env)["NVIDIA_VISIBLE_DEVICES"] for p in late}) == 2


async def test_the_leak_kills_the_neighbour_under_nvidia_and_only_the_leaker_under_gpuslice() -> (
    None
):
    result = await run_demo("sim:2xt4")
    story = result.memory
    assert story is not None
    # the two pods that share GPU 0 after the config, with the plan's share of a T4
    assert (story.neighbour, story.leaker) == ("trainer", "notebook")
    assert (story.gpu, story.total_mib, story.replicas, story.share_mib) == (
        "Tesla T4",
        15360,
        4,
        3840,
    )
    # NVIDIA: the pod within its share dies; the one over it lives on
    assert story.nvidia.fates == {"trainer": "oom", "notebook": "running"}
    assert story.nvidia.peak_used_mib["trainer"] <= story.share_mib
    # gpuslice's guard stops the leaker before the card fills; caps fail its own allocation
    assert story.guard.fates == {"trainer": "running", "notebook": "reclaimed"}
    assert story.caps.fates == {"trainer": "running", "notebook": "capped"}
    # and the per-pod view names the pod over its share at the moment the guard acted
    over = {row.pod: row.over_share for row in story.top}
    assert over == {"trainer": False, "notebook": True}


def test_the_default_demo_prints_the_problem_and_gpuslices_answer_without_jargon() -> None:
    out = CliRunner().invoke(main, ["demo"], env={"COLUMNS": "140"})
    assert out.exit_code == 0, out.output
    text = out.output
    for words in (
        "Insufficient nvidia.com/gpu",
        "NVIDIA's device plugin",
        "CUDA error: out of memory",
        "stopped by the guard",
        "failed at its cap",
        "OVER",
        'gpuslice_pod_memory_over_share{namespace="default",pod="notebook",gpu="0"} 1',
        "$ gpuslice describe --node sim:2xt4",
    ):
        assert words in text, words
    for jargon in ("seed", "admitted again", "Available: 0"):
        assert jargon not in text, jargon


def test_a_config_that_shares_nothing_is_refused_at_once(tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text("version: v1\n")
    started = time.monotonic()
    out = CliRunner().invoke(main, ["demo", "--config-file", str(plain)])
    took = time.monotonic() - started
    assert out.exit_code == 2, out.output
    assert "shares nothing on sim:2xt4" in out.output
    assert "nvidia.com/gpu: 2" in out.output
    assert took < 8.0, f"took {took:.1f} s: the demo waited for a change that cannot come"


def test_config_name_picks_one_config_of_nvidias_multi_config_map() -> None:
    fine = SEEDS / "002-configmap-time-slicing-config-fine.yaml"
    out = CliRunner().invoke(
        main,
        ["demo", "--config-file", str(fine), "--config-name", "tesla-t4", "-o", "json"],
    )
    assert out.exit_code == 0, out.output
    assert '"nvidia.com/gpu": 8' in out.output
    wrong = CliRunner().invoke(
        main, ["demo", "--config-file", str(fine), "--config-name", "a100-80gb"]
    )
    assert wrong.exit_code == 2
    assert "config a100-80gb does not exist" in wrong.output
