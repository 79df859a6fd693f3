"""Every bench still runs: each `bench/bench_*.py` with `--quick`, as its own process with
the project's interpreter, must exit 0 and end with its closing note (`Closing note: ...`,
its main result as ratios to a baseline of the same run). Nothing is timed here: a bench
that no test ran rotted unnoticed once (bench_allocate.py died at start for weeks).

The scripts are found by glob, so a new bench is covered the day it lands; one without
`--quick` fails with a message that says so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "bench").glob("bench_*.py"))
CLOSING = "Closing note:"
RATIO = re.compile(r"\d(?:\.\d+)?x\b")
HANG_GUARD_S = 110
"""Not a timing budget: a `--quick` run takes seconds; this only stops a hung one."""


def smoke_failure(script: Path) -> str | None:
    """Why `script --quick` is not a working smoke run, or None when it is."""
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    if proc.returncode != 0 and "unrecognized arguments: --quick" in proc.stderr:
        return (
            f"{script.name} does not take --quick: every bench needs a smoke mode "
            "(a handful of rounds, nothing asserted about time) under that flag; "
            "see bench/README.md"
        )
    if proc.returncode != 0:
        return f"{script.name} --quick exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    if not last.startswith(CLOSING) or not RATIO.search(last):
        return (
            f"{script.name} --quick did not end with its closing note: the last line must "
            f"start with {CLOSING!r} and give its result as ratios (e.g. 1.25x); got {last!r}"
        )
    return None


def test_the_benches_are_found() -> None:
    assert len(BENCHES) >= 10, [p.name for p in BENCHES]


@pytest.mark.timeout(HANG_GUARD_S + 10)
@pytest.mark.parametrize("script", BENCHES, ids=[p.name for p in BENCHES])
def test_each_bench_runs_quick_and_closes_with_its_ratios(script: Path) -> None:
    failure = smoke_failure(script)
    assert failure is None, failure


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "import argparse\nargparse.ArgumentParser().parse_args()\n"
            "print('Closing note: 1.00x')\n",
            "does not take --quick",
        ),
        ("import sys\nsys.exit(3)\n", "exited 3"),
        ("print('Closing note: all fine')\n", "did not end with its closing note"),
        ("print('Closing note: 1.2x')\nprint('one more line')\n", "got 'one more line'"),
    ],
    ids=["no-quick-flag", "fails", "no-ratio", "note-not-last"],
)
def test_a_broken_bench_fails_the_smoke_with_a_clear_message(
    tmp_path: Path, body: str, expected: str
) -> None:
    script = tmp_path / "bench_broken.py"
    script.write_text(body, encoding="utf-8")
    failure = smoke_failure(script)
    assert failure is not None
    assert expected in failure


def test_a_bench_with_quick_and_a_closing_note_passes_the_smoke(tmp_path: Path) -> None:
    script = tmp_path / "bench_fine.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--quick', "
        "action='store_true')\np.parse_args()\nprint('Closing note: 1.25x the baseline')\n",
        encoding="utf-8",
    )
    assert smoke_failure(script) is None


# -- the lifecycle cases of bench_faults.py ----------------------------------------------------
# `bench_faults.py --quick` leaves them out (two minutes and more together), so each case of
# `faults_lifecycle.py` is run here on its own, with `--require-nothing-lost`: an upgrade, a
# lost or corrupt record, an API-less start, two agents, an agent killed under MPS clients
# and a reboot must cost no running claim or pod its device (hardening round 4, issue 30),
# and what already held (the Prepare/Unprepare soak, a kubelet restart mid-Prepare) holds.

LIFECYCLE = ROOT / "bench" / "faults_lifecycle.py"
LIFECYCLE_GUARD_S = 150
"""Not a timing budget: a case takes 5-30 s on the shared 2-core machine."""


LIST_FAILED = "faults_lifecycle.py --list failed"


def lifecycle_cases() -> list[str]:
    """The cases as the bench lists them (`--list`), so a new one is covered when it lands.
    A bench that cannot list them fails its own test here, not the whole module's collection."""
    proc = subprocess.run(
        [sys.executable, str(LIFECYCLE), "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    return proc.stdout.split() if proc.returncode == 0 else [LIST_FAILED]


@pytest.mark.timeout(LIFECYCLE_GUARD_S + 10)
@pytest.mark.parametrize("case", lifecycle_cases())
def test_each_lifecycle_case_runs_and_reports(case: str) -> None:
    assert case != LIST_FAILED, f"run `{LIFECYCLE.name} --list` to see why it cannot list its cases"
    proc = subprocess.run(
        [sys.executable, str(LIFECYCLE), "--quick", "--case", case, "--require-nothing-lost"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIFECYCLE_GUARD_S,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{case} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    assert f"{case}: " in proc.stderr, f"{case} did not report its run:\n{proc.stderr[-4000:]}"
    report = "lifecycle: what each event lost" if case.startswith("case_") else "already holds"
    assert report in proc.stdout, proc.stdout[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines[-1].startswith(CLOSING), lines[-1]
