"""Every hostile config is a rejection: in the loader, in `describe`/`labels`, and through
live reload of the real daemon, which keeps serving the devices of the plan in force."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslice.agent.configs import load_config
from gpuslice.agent.settings import AgentSettings
from gpuslice.cli.main import main
from gpuslice.core.config import parse_config
from gpuslice.core.errors import ConfigError
from gpuslice.host.configfiles import MAX_BYTES, read_configs
from gpuslice.testing.hostile_configs import HOSTILE, alias_bomb
from tests.e2e.daemon_fixtures import running_daemon

WAIT_S = 20.0
GOOD = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: {n}\n"
)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_load_config_rejects(tmp_path: Path, name: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.format(n=4), encoding="utf-8")
    HOSTILE[name](path)
    with pytest.raises(ConfigError) as err:
        load_config(AgentSettings(node="sim:2xt4", config_path=path))
    assert str(err.value).startswith("invalid config")


@pytest.mark.parametrize("command", ["describe", "labels"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_cli_prints_one_error_line(tmp_path: Path, name: str, command: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.format(n=4), encoding="utf-8")
    HOSTILE[name](path)
    result = CliRunner().invoke(main, [command, "--config-file", str(path), "--node", "sim:2xt4"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert "rror" in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_unreadable_file_rejected(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.format(n=4), encoding="utf-8")
    path.chmod(0)
    with pytest.raises(ConfigError, match="cannot read"):
        read_configs(path)


def test_size_limit_names_the_size(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(ConfigError, match=f"{MAX_BYTES + 1} bytes; at most {MAX_BYTES}"):
        read_configs(path)


def test_directory_total_is_bounded(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"c{i}").write_bytes(b"#" * (MAX_BYTES // 2))
    with pytest.raises(ConfigError, match="at most"):
        read_configs(tmp_path)


def test_alias_bomb_refused_before_expansion() -> None:
    """Refused from the composed graph: it never costs the 1.2 GB its expansion would."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="expands to more than"):
            parse_config(alias_bomb())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024, peak


def test_small_aliases_still_work() -> None:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - &gpu {name: nvidia.com/gpu, replicas: 3}\n"
    )
    config = parse_config(text)
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].replicas == 3


def test_errors_name_the_position() -> None:
    with pytest.raises(ConfigError, match="line 3, column 9"):
        parse_config("version: v1\nflags:\n  when: 2001-02-30\n")


async def test_live_reload_keeps_old_devices_for_every_hostile_config(sock_dir: Path) -> None:
    """The issue's outage, inverted: each hostile config in turn reaches the running daemon;
    each is rejected (logged), the daemon stays up, and the 8 devices stay advertised."""
    args = ["--no-labels", "--config-poll-interval", "0.1"]
    async with running_daemon(sock_dir, GOOD.format(n=4), args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)

        def rejections() -> int:
            return node.daemon.log().count("event=config-rejected")

        for name, put in HOSTILE.items():
            before = rejections()
            put(node.config)
            await kubelet.wait_for(
                lambda b=before: rejections() > b or not node.daemon.running,  # type: ignore[misc]
                WAIT_S,
            )
            assert node.daemon.running, f"{name} ended the daemon:\n{node.daemon.log()}"
            assert kubelet.capacity("nvidia.com/gpu") == 8, name
            assert kubelet.allocatable("nvidia.com/gpu") == 8, name
        # still serving: a pod is admitted, and a good config is applied again
        admission = await kubelet.admit("default", "after", [("main", {"nvidia.com/gpu": 1})])
        assert admission.containers[0].device_ids
        node.write_config(GOOD.format(n=2))
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
        assert "Traceback" not in node.daemon.log()
