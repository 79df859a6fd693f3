"""The command line as users meet it: output shapes, exit codes, and no tracebacks."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuslice.cli.main import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# The CLI also reads Helm values (`config.map`) as a set of named configs, so that one
# corpus file is a valid input here (the parser alone rejects it: tests/core/config).
BAD = sorted(p for p in (CONFIGS / "bad").glob("*.yaml") if p.name != "helm-values-as-config.yaml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_describe_json_has_resources_and_devices() -> None:
    code, out, _ = run(
        "describe",
        "--config-file",
        str(CONFIGS / "seeds/000-default-time-slicing-4.yaml"),
        "--node",
        "sim:2xt4",
        "-o",
        "json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["resources"] == {"nvidia.com/gpu": 8}
    assert len(doc["devices"]) == 2
    share = doc["devices"][0]["resources"][0]
    assert share["replicas"] == 4
    assert "1/4 of the time" in share["share"]
    assert "no memory isolation" in share["share"]


def test_describe_yaml_for_a_named_config_in_helm_values() -> None:
    code, out, _ = run(
        "describe",
        "--config-file",
        str(CONFIGS / "seeds/001-helm-values-multi.yaml"),
        "--config-name",
        "a100",
        "--node",
        "sim:1xa100-80gb",
        "-o",
        "yaml",
    )
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["resources"] == {"nvidia.com/gpu": 10}
    assert doc["devices"][0]["resources"][0]["strategy"] == "mps"


def test_describe_table_names_the_share() -> None:
    code, out, _ = run(
        "describe",
        "--config-file",
        str(CONFIGS / "seeds/001-ls40-mps-10.yaml"),
        "--node",
        "sim:1xl40s",
    )
    assert code == 0
    assert "14 of 142" in out
    assert "4606 MiB" in out


@pytest.mark.parametrize("bad", BAD, ids=[p.name for p in BAD])
def test_every_bad_config_is_a_clear_error_without_traceback(bad: Path) -> None:
    expect = bad.read_text().splitlines()[0].removeprefix("# expect:").strip()
    code, out, err = run("describe", "--config-file", str(bad), "--node", "sim:1xt4")
    assert code == 2, out
    assert err.startswith("error: ")
    assert "Traceback" not in err
    assert expect.split(":")[0] in err


def test_unknown_gpu_model_lists_the_known_ones() -> None:
    code, _, err = run("describe", "--node", "sim:2xv100")
    assert code == 2
    assert "t4" in err
    assert "h200" in err


def test_labels_for_seed_002() -> None:
    code, out, _ = run(
        "labels",
        "--config-file",
        str(CONFIGS / "seeds/002-any-time-slicing-4.yaml"),
        "--node",
        "sim:4xt4",
        "--no-timestamp",
    )
    assert code == 0
    labels = dict(line.split("=", 1) for line in out.splitlines())
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert "nvidia.com/gfd.timestamp" not in labels


def test_top_says_plainly_when_the_daemon_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        code, _, err = run("top", "--url", f"http://127.0.0.1:{port}")
    assert code == 2
    assert err.startswith("error: cannot reach the gpuslice daemon at http://127.0.0.1:")
    assert "Traceback" not in err


def test_device_discovery_strategy_is_read_and_a_bogus_one_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["plugin", "--node", "sim:1xt4", "--device-plugin-path", str(tmp_path), "--no-labels"],
        env={"DEVICE_DISCOVERY_STRATEGY": "bogus"},
    )
    assert result.exit_code == 2
    assert "DEVICE_DISCOVERY_STRATEGY" in result.stderr
    assert "'bogus'" in result.stderr
    assert "Traceback" not in result.stderr


def test_top_finds_the_agent_on_the_pods_metrics_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        result = CliRunner().invoke(main, ["top"], env={"METRICS_PORT": str(port)})
    assert result.exit_code == 2
    assert f"at http://127.0.0.1:{port}:" in result.stderr
