"""`gpuslice demo --scenario guard`: seed 001's story and its numbers."""

from __future__ import annotations

from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.demo.guard import run_guard_demo


def test_guard_off_the_last_pod_dies_guard_on_the_leaker_is_stopped() -> None:
    demo = run_guard_demo()
    assert (demo.gpu, demo.total_mib, demo.share_mib) == ("NVIDIA L40S", 46068, 4606)
    # Off: the pod that started last dies of OOM while asking for less than its share.
    assert {n: f for n, f in demo.off.fates.items() if f != "running"} == {"stress-9": "oom"}
    [oom] = [e for e in demo.off.events if e.what == "oom"]
    assert (oom.at, oom.used_mib, oom.free_mib) == (50.0, 3800, 2668)
    # Enforce: only the leaker is stopped, once its growth (200 MiB/s) would take free memory
    # below the 10 % reserve (4606 MiB) within the 1 s grace plus the lookahead: a poll
    # before the crossing, at 4668 MiB free (2 s later, at 4268, without the projection).
    # Everyone else keeps running.
    assert {n: f for n, f in demo.enforce.fates.items() if f != "running"} == {
        "stress-2": "reclaimed"
    }
    [reclaim] = [e for e in demo.enforce.events if e.what == "reclaim"]
    assert (reclaim.at, reclaim.pod, reclaim.used_mib, reclaim.free_mib) == (
        40.0,
        "stress-2",
        11000,
        4668,
    )
    assert demo.enforce.lost(demo.pods) == []
    assert demo.off.lost(demo.pods) == ["stress-9"]


def test_the_command_prints_both_runs() -> None:
    result = CliRunner().invoke(main, ["demo", "--scenario", "guard"], env={"COLUMNS": "140"})
    assert result.exit_code == 0, result.output
    assert "memory guard off" in result.output
    assert "CUDA error: out of memory" in result.output
    assert "stopped by the guard" in result.output
    assert "gone: stress-2 (reclaimed)" in result.output


def test_with_caps_the_leaker_fails_its_own_allocation_and_nobody_is_stopped() -> None:
    demo = run_guard_demo()
    gone = {n: f for n, f in demo.caps.fates.items() if f != "running"}
    assert gone == {"stress-2": "capped"}
    [capped] = [e for e in demo.caps.events if e.what == "capped"]
    assert capped.used_mib > demo.share_mib  # it asked past its share
    assert capped.free_mib > 0  # with memory still free: its cap, not the card
    assert demo.caps.lost(demo.pods) == []
    assert demo.caps.stopped() == 0
    result = CliRunner().invoke(main, ["demo", "--scenario", "guard"], env={"COLUMNS": "140"})
    assert "its own allocation failed at its hard limit" in result.output
