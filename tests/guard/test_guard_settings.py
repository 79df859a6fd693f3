"""Memory guard flags and environment variables, in the style of the other plugin flags."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuslice.cli.plugin import _guard_settings, plugin
from gpuslice.core.errors import GpusliceError
from gpuslice.core.guard import Reserve

GIB = 1024**3


def parse(args: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        ctx = plugin.make_context("plugin", args)
    return dict(ctx.params)


def test_defaults_observe_with_ten_percent_reserve() -> None:
    g = _guard_settings(parse([]))
    assert g.params.mode == "observe"
    assert g.params.reserve == Reserve(fraction=0.10)
    assert (g.params.grace_s, g.interval_s, g.action) == (1.0, 1.0, "kill")
    assert g.params.lookahead_s == 1.25  # the poll interval plus the exit allowance
    assert g.params.strict is False
    assert g.soft_limits is True


def test_flags() -> None:
    g = _guard_settings(
        parse(
            [
                "--memory-guard=enforce",
                "--memory-guard-reserve=4Gi",
                "--memory-guard-grace=0.5",
                "--memory-guard-interval=0.25",
                "--memory-guard-action=evict",
                "--memory-guard-strict",
                "--no-memory-soft-limits",
            ]
        )
    )
    assert g.params.mode == "enforce"
    assert g.params.reserve == Reserve(bytes=4 * GIB)
    assert (g.params.grace_s, g.interval_s, g.action) == (0.5, 0.25, "evict")
    assert g.params.lookahead_s == 0.5  # follows the interval
    assert g.params.strict is True
    assert g.soft_limits is False


def test_environment() -> None:
    env = {
        "MEMORY_GUARD": "off",
        "MEMORY_GUARD_RESERVE": "15%",
        "MEMORY_GUARD_ACTION": "evict",
        "MEMORY_GUARD_STRICT": "true",
        "MEMORY_SOFT_LIMITS": "false",
    }
    g = _guard_settings(parse([], env))
    assert g.params.mode == "off"
    assert g.params.reserve == Reserve(fraction=0.15)
    assert g.action == "evict"
    assert g.params.strict is True
    assert g.soft_limits is False


@pytest.mark.parametrize("bad", ["lots", "150%", "4GB", "-1"])
def test_bad_reserve_is_a_clear_error(bad: str) -> None:
    result = CliRunner().invoke(plugin, [f"--memory-guard-reserve={bad}"])
    assert result.exit_code == 2
    assert "memory-guard-reserve" in result.output
    assert repr(bad) in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10%", Reserve(fraction=0.1)),
        ("0", Reserve()),
        ("4294967296", Reserve(bytes=4 * GIB)),
        ("512MiB", Reserve(bytes=512 * 1024**2)),
        ("1.5Gi", Reserve(bytes=3 * GIB // 2)),
    ],
)
def test_reserve_forms(text: str, expected: Reserve) -> None:
    assert Reserve.parse(text) == expected


def test_reserve_error_names_the_field() -> None:
    with pytest.raises(GpusliceError, match=r"memoryGuard.reserve: .*'x'"):
        Reserve.parse("x", "memoryGuard.reserve")


TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@pytest.mark.parametrize("soft", [True, False])
def test_the_agent_flag_reaches_allocate(soft: bool) -> None:
    from gpuslice.agent.plan import plan_node
    from gpuslice.agent.settings import AgentSettings, GuardSettings
    from gpuslice.backends import open_backend
    from gpuslice.core.allocation import build_allocation
    from gpuslice.core.config import parse_config

    backend = open_backend("sim:1xl40s", environ={})
    try:
        settings = AgentSettings(node="sim:1xl40s", memory_guard=GuardSettings(soft_limits=soft))
        plan = plan_node(backend.inventory(), parse_config(TIME_SLICING), settings)
        [resource] = plan.resources
        envs = dict(
            build_allocation(
                resource, plan.allocate, [resource.devices[0].id], annotation_id="x"
            ).envs
        )
    finally:
        backend.close()
    assert ("GPUSLICE_MEMORY_LIMIT_MIB" in envs) is soft
    if soft:
        assert envs["GPUSLICE_MEMORY_LIMIT_MIB"] == str(46068 // 4)
