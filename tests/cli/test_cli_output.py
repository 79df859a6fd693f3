"""`-o table|json|yaml` on every command that prints data, and the describe JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.core.jsontypes import Json

SCHEMA_PATH = Path(__file__).parent.parent.parent / "docs" / "schemas" / "describe.schema.json"

TS4 = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
MPS4 = TS4.replace("timeSlicing", "mps")
MIXED_TS2 = (
    "flags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/mig-1g.10gb\n      replicas: 2\n"
)
SINGLE = "flags:\n  migStrategy: single\n"


def _run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _describe(tmp_path: Path, node: str, config: str) -> Json:
    path = tmp_path / "config.yaml"
    path.write_text(config, encoding="utf-8")
    data: Json = json.loads(
        _run("describe", "--node", node, "--config-file", str(path), "-o", "json")
    )
    return data


def _schema() -> Json:
    schema: Json = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_labels_json_and_yaml_hold_the_same_labels_as_the_table() -> None:
    base = ("labels", "--node", "sim:2xt4", "--no-timestamp")
    table = dict(line.split("=", 1) for line in _run(*base).splitlines())
    assert json.loads(_run(*base, "-o", "json")) == table
    assert yaml.safe_load(_run(*base, "-o", "yaml")) == table
    assert table["nvidia.com/gpu.count"] == "2"


@pytest.mark.parametrize(
    ("node", "config"),
    [
        ("sim:2xt4", ""),
        ("sim:2xt4", TS4),
        ("sim:2xt4", MPS4),
        ("sim:1xa100-80gb/mig=1g.10gb*7", MIXED_TS2),
        ("sim:1xa100-80gb/mig=1g.10gb*7", SINGLE),
        ("sim:1xa100-80gb/mig=1g.10gb*7,1xa100-80gb", SINGLE),  # invalid layout
    ],
    ids=["whole", "time-slicing", "mps", "mixed-mig-ts", "single", "single-invalid"],
)
def test_describe_json_matches_the_schema(tmp_path: Path, node: str, config: str) -> None:
    jsonschema.validate(_describe(tmp_path, node, config), _schema())


def test_schema_rejects_a_share_without_its_fields(tmp_path: Path) -> None:
    """The schema is strict enough to fail: a share missing `isolation` is invalid."""
    data = _describe(tmp_path, "sim:1xt4", TS4)
    del data["devices"][0]["resources"][0]["isolation"]
    with pytest.raises(jsonschema.ValidationError, match="isolation"):
        jsonschema.validate(data, _schema())


def _share(data: Json) -> Json:
    share: Json = data["devices"][0]["resources"][0]
    return share


def test_describe_json_gives_each_share_as_fields(tmp_path: Path) -> None:
    ts = _share(_describe(tmp_path, "sim:1xt4", TS4))
    assert ts["strategy"] == "time-slicing"
    assert ts["isolation"] == "none"
    assert ts["sm_share"] == 0.25
    assert ts["active_thread_percentage"] is None
    assert ts["memory_mib"] == 15360 // 4
    assert ts["memory_enforced"] is False

    mps = _share(_describe(tmp_path, "sim:1xt4", MPS4))
    assert mps["strategy"] == "mps"
    assert mps["isolation"] == "mps"
    assert mps["active_thread_percentage"] == 25
    assert mps["sm_share"] == 0.25
    assert mps["memory_mib"] == 15360 // 4
    assert mps["memory_enforced"] is True

    mig = _share(
        _describe(tmp_path, "sim:1xa100-80gb/mig=1g.10gb*7", "flags:\n  migStrategy: mixed\n")
    )
    assert mig["isolation"] == "mig"
    assert mig["sm_share"] == 1.0
    assert mig["memory_mib"] == 9728  # the simulator's 1g.10gb on an A100-80GB

    whole = _share(_describe(tmp_path, "sim:1xt4", ""))
    assert (whole["isolation"], whole["sm_share"], whole["memory_mib"]) == ("none", 1.0, 15360)


def test_demo_json_lists_its_steps() -> None:
    data = json.loads(_run("demo", "-o", "json"))
    assert data["node"] == "sim:2xt4"
    assert len(data["steps"]) >= 3


@pytest.mark.parametrize("command", ["describe", "labels", "top", "demo"])
def test_every_data_command_takes_output(command: str) -> None:
    assert "-o, --output [table|json|yaml]" in _run(command, "--help")
