"""`gpuslice describe` on MIG nodes: the layout per GPU, the counts, and the refusals.

The JSON case runs `python -m gpuslice` as a process, the way a user runs it; the other
cases use click's runner on the same command to stay fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuslice.cli.main import main
from tests.core.sharing.mig_nodes import SEEDS, inventory

SEED_001_NODE = "sim:1xa100-80gb/mig=1g.10gb*7"
SEED_001_SINGLE = SEEDS / "001-a100-mig-single.yaml"


def test_describe_json_shows_seed_001_mig_layout() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslice",
            "describe",
            "--node",
            SEED_001_NODE,
            "--config-file",
            str(SEED_001_SINGLE),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["resources"] == {"nvidia.com/gpu": 7}
    assert data["mig_strategy"] == "single"
    assert data["warnings"] == []
    (gpu,) = data["devices"]
    assert gpu["product"] == "NVIDIA A100 80GB PCIe"
    assert gpu["mig_enabled"] is True
    migs = gpu["mig_devices"]
    # Seed 001's `nvidia-smi mig -lgip`: 1g.10gb is 9.50 GiB with 14 SMs.
    assert [(m["profile"], m["memory_mib"], m["memory"], m["multiprocessors"]) for m in migs] == [
        ("1g.10gb", 9728, "9.5 GiB", 14)
    ] * 7
    assert [m["index"] for m in migs] == [f"0:{j}" for j in range(7)]
    expected = [m.uuid for m in inventory(SEED_001_NODE).gpus[0].mig_devices]
    assert [m["uuid"] for m in migs] == expected
    # Each MIG device is advertised whole under nvidia.com/gpu.
    shares = gpu["resources"]
    assert [(s["resource"], s["device"], s["replicas"]) for s in shares] == [
        ("nvidia.com/gpu", u, 1) for u in expected
    ]
    assert {s["share"] for s in shares} == {"1g.10gb: 9.5 GiB, 14 SMs, hardware-isolated"}


def _describe(*args: str) -> tuple[int, str, str]:
    # Wide enough that rich does not wrap the table's cells.
    result = CliRunner().invoke(main, ["describe", *args], env={"COLUMNS": "250"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_describe_yaml_mixed_layout_with_seed_002_time_slicing() -> None:
    code, out, err = _describe(
        "--node",
        "sim:1xa100-40gb/mig=3g.20gb+2g.10gb+1g.5gb*2,1xa100-40gb",
        "--config-file",
        str(SEEDS / "002-fine-a100-40gb.yaml"),
        "-o",
        "yaml",
    )
    assert code == 0, err
    data = yaml.safe_load(out)
    assert data["resources"] == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
    }
    mig_gpu, plain = data["devices"]
    assert [(m["index"], m["profile"], m["multiprocessors"]) for m in mig_gpu["mig_devices"]] == [
        (m.index_id, m.profile, m.multiprocessors)
        for m in inventory("sim:1xa100-40gb/mig=3g.20gb+2g.10gb+1g.5gb*2").gpus[0].mig_devices
    ]
    assert sorted(m["profile"] for m in mig_gpu["mig_devices"]) == [
        "1g.5gb",
        "1g.5gb",
        "2g.10gb",
        "3g.20gb",
    ]
    small = [s for s in mig_gpu["resources"] if s["resource"] == "nvidia.com/mig-1g.5gb"]
    assert [s["replicas"] for s in small] == [2, 2]
    assert all(s["share"].startswith("1/2 of the time of MIG 1g.5gb (") for s in small)
    assert plain["mig_devices"] == []


def test_describe_table_lists_each_mig_device(tmp_path: Path) -> None:
    config = tmp_path / "mixed.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n", encoding="utf-8")
    code, out, err = _describe(
        "--node", "sim:1xa30/mig=2g.12gb+1g.6gb*2", "--config-file", str(config)
    )
    assert code == 0, err
    # rich wraps a title to its table's width: compare with whitespace collapsed.
    assert "MIG strategy mixed" in " ".join(out.split())
    assert "nvidia.com/mig-1g.6gb" in out
    assert out.count("MIG 1g.6gb") == 2
    assert out.count("MIG 2g.12gb") == 1


@pytest.mark.parametrize(
    ("node", "config", "message"),
    [
        (
            SEED_001_NODE,
            "version: v1\nflags:\n  migStrategy: single\nsharing:\n  mps:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 2\n",
            "sharing using MPS is not supported for MIG devices",
        ),
        (
            SEED_001_NODE,
            "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n"
            "    - name: nvidia.com/mig-1g.10gb\n      replicas: 2\n",
            "using migStrategy 'mixed' is not supported with MPS",
        ),
        (
            "sim:1xa100-80gb/mig=3g.40gb*3",
            "version: v1\nflags:\n  migStrategy: mixed\n",
            "3x 3g.40gb asked, at most 2 fit; profiles (with max counts): 1g.10gb*7, "
            "1g.10gb+me*1, 1g.20gb*4, 2g.20gb*3, 3g.40gb*2, 4g.40gb*1, 7g.80gb*1",
        ),
    ],
    ids=["mps-single", "mps-mixed", "layout-too-big"],
)
def test_describe_refuses_with_one_clear_line(
    tmp_path: Path, node: str, config: str, message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config, encoding="utf-8")
    code, out, err = _describe("--node", node, "--config-file", str(path), "-o", "json")
    assert code == 2
    assert out == ""
    assert err.startswith("error: ")
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_single_invalid_layout_labels_mig_invalid_like_gfd_mig_strategy_go(
    tmp_path: Path,
) -> None:
    """GFD `internal/lm/mig-strategy.go` (TestMigStrategySingleLabels): a layout `single`
    cannot serve is labelled `<model>-MIG-INVALID` with count, replicas and memory 0; the
    command succeeds, and describe shows nothing advertised with the reason."""
    path = tmp_path / "single.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: single\n", encoding="utf-8")
    node = "sim:1xa100-80gb/mig=1g.10gb*7,1xa100-80gb"
    result = CliRunner().invoke(
        main, ["labels", "--node", node, "--config-file", str(path), "--no-timestamp"]
    )
    assert result.exit_code == 0, result.stderr
    lines = set(result.stdout.splitlines())
    assert "nvidia.com/gpu.product=NVIDIA-A100-80GB-PCIe-MIG-INVALID" in lines
    assert {"nvidia.com/gpu.count=0", "nvidia.com/gpu.replicas=0", "nvidia.com/gpu.memory=0"} <= (
        lines
    )
    code, out, err = _describe("--node", node, "--config-file", str(path), "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["resources"] == {} or report["resources"] == []
    assert any("same migEnabled value" in w for w in report["warnings"])
