"""`gpuslice advise --samples`: the answers known by construction, the config it writes
going through `describe` unchanged, and bad input as one clear error line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gpuslice.cli import advise as advise_cli
from gpuslice.core.advise import AdviseError
from gpuslice.prometheus.client import MAX_BODY_BYTES
from tests.core.advise.advise_cases import by_model, check_known_answers, run


def test_known_answers_from_a_samples_file(samples_file: Path) -> None:
    code, out, err = run("advise", "--samples", str(samples_file), "-o", "json")
    assert code == 0, err
    check_known_answers(by_model(out))


def test_yaml_says_the_same(samples_file: Path) -> None:
    code, out, _ = run("advise", "--samples", str(samples_file), "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(out)["models"][0]["time_slicing"]["replicas"] == 8


def test_the_table_names_the_leaker_the_idle_node_and_the_plan(samples_file: Path) -> None:
    code, out, err = run("advise", "--samples", str(samples_file))
    assert code == 0, err
    assert "replicas 8" in out
    assert "leaker: ml/leaky" in out
    assert "idle: none of the 4 pods on NVIDIA L40S" in out
    assert "1g.20gb*4" in out


def test_the_written_config_goes_through_describe_unchanged(
    samples_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "advised.yaml"
    code, _, err = run(
        "advise", "--samples", str(samples_file), "--write-config", str(config), "-o", "json"
    )
    assert code == 0, err
    doc = yaml.safe_load(config.read_text())
    assert doc["kind"] == "ConfigMap"
    assert set(doc["data"]) == {"h100-80gb"}
    assert "nvidia.com/device-plugin.config=h100-80gb" in config.read_text()
    code, out, err = run(
        "describe",
        "--config-file",
        str(config),
        "--config-name",
        "h100-80gb",
        "--node",
        "sim:2xh100-80gb",
        "-o",
        "json",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["resources"] == {"nvidia.com/gpu": 16}
    assert {s["replicas"] for d in report["devices"] for s in d["resources"]} == {8}


def test_since_cuts_the_range(samples_file: Path) -> None:
    """Only the last 20 minutes: the leaker is still caught, the peaks may be lower."""
    code, out, err = run("advise", "--samples", str(samples_file), "--since", "20m", "-o", "json")
    assert code == 0, err
    h100 = by_model(out)["NVIDIA H100 80GB HBM3"]
    assert max(p["lifetime_s"] for p in h100["pods"]) <= 20 * 60 + 15
    assert h100["leakers"] == ["ml/leaky"]


def test_a_current_replicas_override_is_replayed(samples_file: Path) -> None:
    code, out, _ = run(
        "advise", "--samples", str(samples_file), "--current-replicas", "2", "-o", "json"
    )
    assert code == 0
    h100 = by_model(out)["NVIDIA H100 80GB HBM3"]
    assert h100["replay"]["current"]["replicas"] == 2
    assert h100["replay"]["current"]["gpus"] == 4


def test_plot_writes_a_png_or_says_what_is_missing(samples_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "advise.png"
    code, _, err = run("advise", "--samples", str(samples_file), "--plot", str(png), "-o", "json")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code == 2
        assert "pip install 'gpuslice[plot]'" in err
        return
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            'gpuslice_pod_memory_used_bytes{pod="a" 12 1700000000\n',
            "not valid Prometheus text format",
        ),
        ("# TYPE x gauge\nx 1 1700000000\n# EOF\n", "no gpuslice_pod_memory_used_bytes series"),
        ('gpuslice_pod_memory_used_bytes{pod="a"} 12\n', "without a timestamp"),
        ("", "no gpuslice_pod_memory_used_bytes series"),
        ('gpuslice_pod_memory_used_bytes{pod="a"} 12 1700000000000\n', "two samples or more"),
    ],
)
def test_bad_samples_are_one_error_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.prom"
    path.write_text(content)
    code, _, err = run("advise", "--samples", str(path))
    assert code == 2
    assert err.startswith("error: "), err
    assert message in err, err


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = run("advise", "--samples", str(fifo))
    assert code == 2
    assert "FIFO" in err


def test_a_file_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    """Bound as one answer from Prometheus is (64 MiB), with one error line naming the file
    and the bound: a 200 MB file took 1.5 GB. The file is sparse: its size is what is
    refused, before a byte of it is read (so no 64 MiB is written either)."""
    big = tmp_path / "big.prom"
    with big.open("wb") as f:
        f.truncate(MAX_BODY_BYTES + 1)
    code, _, err = run("advise", "--samples", str(big))
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"error: {big}: {MAX_BODY_BYTES + 1:,} bytes, over 64 MiB"), line
    assert "--prometheus" in line


def test_the_bound_is_a_parameter_and_the_file_is_not_read_past_it(tmp_path: Path) -> None:
    small = tmp_path / "small.prom"
    small.write_text("x" * 2048)
    with pytest.raises(AdviseError, match=r"2,048 bytes, over 0 MiB \(1024 bytes"):
        advise_cli.load_history(None, small, None, None, None, max_file_bytes=1024)


def test_a_file_of_more_lines_than_one_answers_samples_is_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every line is a sample the parser builds before any is dropped (`x 1 1`: 11 million
    of them in 64 MiB): counted first, as an answer's samples are."""
    from gpuslice.prometheus import samples as samples_module

    monkeypatch.setattr(samples_module, "MAX_ANSWER_SAMPLES", 10)
    monkeypatch.setattr(samples_module, "MAX_SERIES", 1)
    lines = tmp_path / "lines.prom"
    lines.write_text("".join(f"x {i} {1700000000 + i}\n" for i in range(40)))
    code, _, err = run("advise", "--samples", str(lines))
    assert code == 2
    assert err.startswith(f"error: {lines}: more than 10 samples in one file"), err


def test_exactly_one_source(samples_file: Path) -> None:
    code, _, err = run("advise")
    assert code == 2
    assert "--prometheus URL or --samples FILE" in err
    code, _, err = run("advise", "--samples", str(samples_file), "--prometheus", "http://x")
    assert code == 2


def test_the_written_claims_ask_for_the_advised_profile_and_fit_a_dynamic_gpu(
    samples_file: Path, tmp_path: Path
) -> None:
    """The H100 pods fit 1g.20gb: one template for it, whose claims the scheduler's rules
    (the emulator's allocator) place on a dynamic H100's 1g.20gb partitions, four of them
    (its four placements) and not a fifth."""
    from gpuslice.backends import open_backend
    from gpuslice.core.dra.partitions import (
        counter_sets,
        dynamic_gpus,
        node_devices,
        with_consumption,
    )
    from gpuslice.core.dra.publish import device_json, dra_devices, plan_slices
    from gpuslice.whatif.allocator import AllocationError, allocate

    claims = tmp_path / "claims.yaml"
    code, _, err = run("advise", "--samples", str(samples_file), "--write-claims", str(claims))
    assert code == 0, err
    [doc] = list(yaml.safe_load_all(claims.read_text()))
    assert doc["kind"] == "ResourceClaimTemplate"
    assert doc["metadata"]["name"] == "mig-h100-80gb-1g20gb"
    assert '"ml/' in claims.read_text()  # the pods it suits, as comments

    inventory = open_backend("sim:1xh100-80gb/mig=").inventory()
    dyn = dynamic_gpus(inventory, {"all"})
    devices = [
        with_consumption(device_json(d, []), dyn[d.gpu.uuid])
        for d in node_devices(dra_devices(inventory), dyn)
    ]
    sets = counter_sets(dyn)
    slices = plan_slices([], devices, driver="gpu.nvidia.com", node="n", node_uid="",
                         counter_sets=sets).create  # fmt: skip
    expression = (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    )
    classes = [{"metadata": {"name": "mig.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}]  # fmt: skip
    claim = {"metadata": {"name": "c"}, "spec": doc["spec"]["spec"]}
    held: list[dict[str, object]] = []
    for _ in range(4):
        allocation = allocate(claim, classes, slices, held)
        [result] = allocation["devices"]["results"]
        assert result["device"].startswith("gpu-0-mig-1g20gb-15-")
        held.append(allocation)
    with pytest.raises(AllocationError, match="no device left"):
        allocate(claim, classes, slices, held)
