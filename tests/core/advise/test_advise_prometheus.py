"""`gpuslice advise --prometheus` against a real Prometheus (Debian's `prometheus`): the
series of seeded synthetic workloads are loaded with `promtool tsdb create-blocks-from
openmetrics`, and advise must find the answers known by construction, the same as from
the samples file, in a few requests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.core.advise import build_history
from gpuslice.prometheus.client import MAX_POINTS, PrometheusReader, Window, chunks
from gpuslice.testing import promserver
from tests.core.advise.advise_cases import END, by_model, check_known_answers, run

pytestmark = pytest.mark.skipif(promserver.missing() is not None, reason=str(promserver.missing()))


@pytest.fixture(scope="module")
def prometheus(samples_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("prometheus")
    promserver.create_blocks(samples_file, work / "tsdb")
    with promserver.serving(work / "tsdb", work) as url:
        yield url


def test_known_answers_from_prometheus(prometheus: str) -> None:
    code, out, err = run(
        "advise",
        "--prometheus",
        prometheus,
        "--since",
        "3h",
        "--until",
        str(END + 30),
        "-o",
        "json",
    )
    assert code == 0, err
    check_known_answers(by_model(out))


def test_the_same_answers_as_the_samples_file(prometheus: str, samples_file: Path) -> None:
    def plan(*source: str) -> list[object]:
        code, out, err = run("advise", *source, "-o", "json")
        assert code == 0, err
        return [
            (m["model"], m["time_slicing"], m["mps"], m["mig"], m["dra"], m["leakers"], m["idle"])
            for m in json.loads(out)["models"]
        ]

    window = ("--since", "3h", "--until", str(END + 30))
    assert plan("--prometheus", prometheus, *window) == plan("--samples", str(samples_file))


def test_a_few_requests_whatever_the_number_of_pods(prometheus: str) -> None:
    reader = PrometheusReader(prometheus)
    window = Window(END - 3 * 3600, END + 30, 15.0)
    series = reader.series(window)
    # the probe (any pod memory at all?), two ranges in one chunk each, three instant queries
    assert reader.requests == 6
    assert len({s.labels["pod"] for s in series if "pod" in s.labels}) == 11
    history = build_history(series, 15.0, start=window.start)
    assert len(history.pods) == 11


def test_ranges_are_cut_into_chunks_prometheus_accepts(prometheus: str) -> None:
    """A step small enough to need several chunks: every chunk is accepted, and the
    chunks join without a gap or an overlap."""
    window = Window(END - 2 * 3600, END, 0.5)
    parts = chunks(window)
    assert len(parts) == 2
    assert all((b - a) / window.step_s + 1 <= MAX_POINTS for a, b in parts)
    assert parts[1][0] == pytest.approx(parts[0][1] + window.step_s)
    reader = PrometheusReader(prometheus)
    series = reader.series(window)
    assert reader.requests == 1 + 2 * 2 + 3  # the probe, two chunks of two ranges, instants
    memory = [s for s in series if s.name == "gpuslice_pod_memory_used_bytes"]
    times = [t for t, _ in memory[0].points]
    assert times == sorted(set(times))


def test_nothing_in_the_range_is_said_plainly(prometheus: str) -> None:
    code, _, err = run("advise", "--prometheus", prometheus, "--until", "1500000000")
    assert code == 2
    assert "no gpuslice_pod_memory_used_bytes series in the range" in err


def test_an_error_from_prometheus_is_one_line(prometheus: str) -> None:
    code, _, err = run("advise", "--prometheus", prometheus, "--step", "0.0001s", "--since", "7d")
    assert code == 2
    assert err.startswith("error: Prometheus at ")
    assert "refused" in err


def test_not_prometheus_is_one_line(prometheus: str) -> None:
    code, _, err = run("advise", "--prometheus", prometheus + "/nothing-here")
    assert code == 2
    assert "not Prometheus's API JSON" in err


def test_unreachable_prometheus_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens
    code, _, err = run("advise", "--prometheus", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert code == 2
    assert f"cannot reach Prometheus at http://127.0.0.1:{port}" in err


def test_the_installed_command_reads_prometheus(prometheus: str) -> None:
    """Through the console script, as a person runs it (lazy registration included)."""
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslice",
            "advise",
            "--prometheus",
            prometheus,
            "--since",
            "3h",
            "--until",
            str(END + 30),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "replicas 8" in proc.stdout
    assert time.monotonic() - started < 60
