"""The shipped wheel: no test doubles inside, everything `gpuslice demo` needs inside."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # Build from a copy of the sources: setuptools reuses an in-tree build/ directory and
    # never prunes it, so a wheel built before the exclusion would keep the doubles in it.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src",
        source / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=build,
        timeout=300,
    )
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("pip is not available in this interpreter")
    assert proc.returncode == 0, proc.stderr
    [whl] = out.glob("gpuslice-*.whl")
    with zipfile.ZipFile(whl) as z:
        return set(z.namelist())


def test_the_test_doubles_are_not_shipped(wheel_names: set[str]) -> None:
    assert not [n for n in wheel_names if n.startswith("gpuslice/testing/")]


def test_what_the_demo_needs_is_shipped(wheel_names: set[str]) -> None:
    for module in (
        "gpuslice/cli/demo.py",
        "gpuslice/demo/scenario.py",
        "gpuslice/emulator/kubelet.py",
        "gpuslice/backends/simulated/__init__.py",
        "gpuslice/protos/deviceplugin/v1beta1/api_pb2.py",
    ):
        assert module in wheel_names, module


def test_the_charts_default_image_is_the_one_make_image_push_publishes() -> None:
    import re
    import tomllib

    import yaml

    chart = ROOT / "deploy/helm/gpuslice"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    make = (ROOT / "Makefile").read_text()
    [image] = re.findall(r"^IMAGE \?= (\S+)$", make, re.M)
    assert values["image"]["repository"] == image
    assert values["image"]["tag"] == "", "the tag follows the chart's appVersion"
    assert app_version == version, "make tags the image with pyproject's version"
    workflow = (ROOT / ".github/workflows/image.yml").read_text()
    assert "/gpuslice:${{ steps.version.outputs.version }}" in workflow
