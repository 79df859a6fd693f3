"""`gpuslice describe` says whether memory caps can apply on the cgroup tree the agent is
told to use (`--cgroup-root`, `CGROUP_ROOT`), as the agent decides it (issue 40 item 8): in
the agent's pod, /sys/fs/cgroup is the pod's own cgroup namespace, and only the chart's
mount of the host's tree holds the pods' cgroups."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.core.jsontypes import Json

TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


def _node(tmp_path: Path) -> Path:
    node = tmp_path / "node.yaml"
    node.write_text('driverVersion: "615.20"\ngpus:\n  - model: l40s\n', encoding="utf-8")
    return node


def _tree(root: Path, *, pods: bool) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n", encoding="utf-8")
    if pods:
        (root / "kubepods.slice").mkdir()
    return root


def _gpu(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Json:
    config = tmp_path / "config.yaml"
    config.write_text(TS4, encoding="utf-8")
    result = CliRunner(env={"MEMORY_GUARD": "enforce", **(env or {})}).invoke(
        main,
        [
            "describe", "--node", str(_node(tmp_path)), "--config-file", str(config),
            "-o", "json", *args,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [gpu] = json.loads(result.output)["devices"]
    return dict(gpu)


def test_the_cgroup_root_flag_is_the_agents(tmp_path: Path) -> None:
    host = _tree(tmp_path / "host", pods=True)
    gpu = _gpu(tmp_path, "--cgroup-root", str(host))
    assert (gpu["memory_protection"], gpu["memory_protection_reason"]) == ("capped", None)


def test_the_cgroup_root_variable_is_read_as_the_agent_reads_it(tmp_path: Path) -> None:
    own = _tree(tmp_path / "own-namespace", pods=False)
    gpu = _gpu(tmp_path, env={"CGROUP_ROOT": str(own)})
    assert gpu["memory_protection"] == "guarded"
    assert gpu["memory_protection_reason"] == (
        "pods' cgroups not found under --cgroup-root (mount the host's /sys/fs/cgroup there)"
    )
    host = _tree(tmp_path / "host", pods=True)
    assert _gpu(tmp_path, env={"CGROUP_ROOT": str(host)})["memory_protection"] == "capped"


def test_an_observing_guard_is_no_protection(tmp_path: Path) -> None:
    own = _tree(tmp_path / "own-namespace", pods=False)
    gpu = _gpu(tmp_path, "--cgroup-root", str(own), env={"MEMORY_GUARD": "observe"})
    assert gpu["memory_protection"] == "none"
