"""`gpuslice describe --claims` as users run it: exit codes, the one-line error for bad
input, and JSON that follows docs/schemas/describe-claims.schema.json (scripts rely on it)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.core.jsontypes import Json

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs/schemas/describe-claims.schema.json").read_text("utf-8"))
TS4 = ROOT / "tests/configs/seeds/000-default-time-slicing-4.yaml"
EXAMPLE = ROOT / "tests/configs/claims/shares.yaml"
MIG_NODE = "sim:1xh100-80gb,1xh100-80gb/mig=1g.10gb*7"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "140"})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def as_json(*args: str) -> tuple[int, Json]:
    code, out, err = run(*args, "-o", "json")
    assert err == ""
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return code, doc


def claims_file(tmp_path: Path, *docs: str) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text("\n---\n".join(docs), encoding="utf-8")
    return path


def plain_claim(name: str) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: gpu.nvidia.com}}
"""


def test_four_claims_share_a_gpu_sliced_four_ways_and_a_fifth_is_refused(tmp_path: Path) -> None:
    path = claims_file(tmp_path, *(plain_claim(f"c{i}") for i in range(5)))
    args = ("describe", "--node", "sim:1xh100-80gb", "--config-file", str(TS4))
    code, doc = as_json(*args, "--claims", str(path))
    assert code == 1, "a claim that does not fit is exit code 1"
    assert [c["fits"] for c in doc["claims"]] == [True] * 4 + [False]
    assert doc["devices"][0]["shares"] == 4
    assert {c["devices"][0]["share"]["shares"] for c in doc["claims"][:4]} == {1}
    fifth = doc["claims"][4]
    assert fifth["stage"] == "allocate"
    assert fifth["error"].startswith("claim default/c4: request 'gpu': no device left: gpu-0")

    code, out, _ = run(*args, "--claims", str(path))
    assert code == 1
    assert "4 of 5 claims fit." in out
    assert "1 of 4 shares (time-slicing)" in out
    assert "no device left" in out


def test_an_mps_claim_shows_its_daemon_limits_and_pipe(tmp_path: Path) -> None:
    path = claims_file(
        tmp_path,
        """
kind: ResourceClaim
metadata: {name: mps, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: MPS
            mpsConfig: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 20Gi}
""",
    )
    code, doc = as_json("describe", "--node", "sim:1xh100-80gb", "--claims", str(path))
    assert code == 0
    (device,) = doc["claims"][0]["devices"]
    assert (device["sharing"], device["mps_thread_percentage"]) == ("mps", 50)
    assert device["mps_pinned_limit_mib"] == 20480
    assert device["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    pipe = device["mounts"][0]["host_path"]
    assert pipe.startswith("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/")
    assert pipe.endswith("/pipe")
    assert device["entitlement"] == {"kind": "mps", "memory_mib": 20480, "sm_fraction": 0.5}


def test_a_whole_gpu_nobody_shares_is_exclusive_in_json_and_table(tmp_path: Path) -> None:
    """A node without a sharing config hands a claim the whole GPU: the JSON and the table
    name it `exclusive`, as they always have (the plan's strategy says `none`)."""
    path = claims_file(tmp_path, plain_claim("whole"))
    code, doc = as_json("describe", "--node", "sim:1xh100-80gb", "--claims", str(path))
    assert code == 0
    (device,) = doc["claims"][0]["devices"]
    assert (device["sharing"], device["entitlement"]["kind"]) == ("exclusive", "exclusive")
    assert device["sharing_text"] == "exclusive: the whole GPU, for the pods of this claim"
    code, out, _ = run("describe", "--node", "sim:1xh100-80gb", "--claims", str(path))
    assert code == 0
    assert "exclusive: 79.6" in out  # the guard column: 79.6 GiB, no SM share
    assert "of SMs" not in out


def test_mps_on_a_mig_device_multi_user_is_shown_as_prepare_runs_it(tmp_path: Path) -> None:
    """NVIDIA's MigDeviceConfig with MPS and multiUser, as a user would check it first."""
    path = claims_file(
        tmp_path,
        """
kind: ResourceClaim
metadata: {name: mig-mps, namespace: ml}
spec:
  devices:
    requests:
    - name: mig
      exactly: {deviceClassName: mig.nvidia.com}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: MigDeviceConfig
          sharing:
            strategy: MPS
            mpsConfig: {defaultPinnedDeviceMemoryLimit: 5Gi, multiUser: true}
""",
    )
    code, doc = as_json("describe", "--node", MIG_NODE, "--claims", str(path))
    assert code == 0
    (device,) = doc["claims"][0]["devices"]
    assert (device["type"], device["sharing"], device["mps_pinned_limit_mib"]) == (
        "mig", "mps", 5120)  # fmt: skip
    assert device["mounts"][0]["host_path"].endswith("/pipe")
    code, out, _ = run("describe", "--node", MIG_NODE, "--claims", str(path))
    assert code == 0
    assert "MPS on the MIG device" in out
    assert "multi-user daemon" in out


def test_a_mig_device_chosen_by_cel(tmp_path: Path) -> None:
    path = claims_file(
        tmp_path,
        """
kind: ResourceClaim
metadata: {name: small}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
""",
    )
    code, doc = as_json("describe", "--node", MIG_NODE, "--claims", str(path))
    assert code == 0
    assert [d["type"] for d in doc["devices"]].count("mig") == 7
    (device,) = doc["claims"][0]["devices"]
    assert (device["type"], device["profile"]) == ("mig", "1g.10gb")
    assert device["env"]["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert device["entitlement"]["kind"] == "mig"


def test_the_readme_example_fits_and_prints_a_table() -> None:
    code, out, err = run(
        "describe", "--node", "sim:1xh100-80gb", "--config-file", str(TS4),
        "--claims", str(EXAMPLE),
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert "3 of 3 claims fit." in out
    assert "2 of 4 shares" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: ResourceClaim\nmetadata: {name: x}\nspec: {devices: {requests: [{name: g}]}}\n",
         "needs exactly or a firstAvailable list"),
        ("kind: ResourceClaim\nmetadata: {name: [\n", "YAML syntax error at line 3"),
        ("kind: DeviceClass\nmetadata: {name: x}\n", "is not a ResourceClaim"),
    ],
)  # fmt: skip
def test_a_malformed_claims_file_is_one_error_line_and_exit_2(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = claims_file(tmp_path, text)
    code, out, err = run("describe", "--node", "sim:1xh100-80gb", "--claims", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: ")
    assert expected in err
    assert "Traceback" not in err


def test_device_classes_without_claims_is_a_usage_error(tmp_path: Path) -> None:
    path = claims_file(tmp_path, "kind: DeviceClass\nmetadata: {name: x}\n")
    code, _, err = run("describe", "--node", "sim:1xt4", "--device-classes", str(path))
    assert code == 2
    assert "--device-classes goes with --claims" in err


def test_describe_claims_takes_the_agents_consumable_shares(tmp_path: Path) -> None:
    """Five claims that ask for nothing on one GPU the config does not share: whole GPUs
    (`replicas`, the default) fit one; NVIDIA's `unlimited` fits all five."""
    docs = [
        f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: c{i}}}\n"
        "spec:\n  devices:\n    requests:\n    - name: gpu\n"
        "      exactly: {deviceClassName: gpu.nvidia.com}\n"
        for i in range(5)
    ]
    path = str(claims_file(tmp_path, *docs))
    code, doc = as_json("describe", "--node", "sim:1xh100-80gb", "--claims", path)
    assert code == 1
    assert [c["fits"] for c in doc["claims"]] == [True, False, False, False, False]
    code, doc = as_json(
        "describe",
        "--node",
        "sim:1xh100-80gb",
        "--claims",
        path,
        "--consumable-shares",
        "unlimited",
    )
    assert code == 0
    assert all(c["fits"] for c in doc["claims"])
    code, _, err = run(
        "describe", "--node", "sim:1xh100-80gb", "--claims", path, "--consumable-shares", "lots"
    )
    assert code == 2
    assert "--consumable-shares 'lots': must be 'replicas'" in err
