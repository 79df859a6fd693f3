"""What a claim sends reaches the agent's log escaped and bounded: a claim's opaque config is
written by whoever may create ResourceClaims, and the driver logs why it refused one. A raw
CR or ANSI escape in it would rewrite what an operator's terminal shows, and a 5 KB value
would make a 5 KB line. The line goes through the agent's own formatter (`cli.logsetup`),
text and JSON, as `gpuslice plugin` sets it up."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator

import pytest

from gpuslice.cli.logsetup import formatter
from tests.agent.dra_driver.rig import Rig

HOSTILE = "\r\x1b[2J" + "\u2028\x85" + "A" * 5000
"""Clears the screen from the start of the line, two line breaks of other viewers, 5 KB."""
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@pytest.fixture(params=["text", "json"])
def agent_log(request: pytest.FixtureRequest) -> Iterator[tuple[str, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(request.param))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield request.param, stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def test_a_claims_opaque_config_reaches_the_log_escaped_and_bounded(
    make_rig: Callable[..., Awaitable[Rig]],
    agent_log: tuple[str, io.StringIO],
) -> None:
    fmt, stream = agent_log
    rig = await make_rig()
    driver = rig.driver()
    await driver.load()
    guard = {"apiVersion": "resource.gpuslice.io/v1alpha1", "kind": "GuardConfig"}
    ref = rig.claim("hostile", {**guard, "mode": HOSTILE})
    error = (await driver.prepare([ref]))[ref.uid].error
    assert "mode" in error
    lines = stream.getvalue().splitlines()
    [failed] = [line for line in lines if "dra-prepare-failed" in line]
    assert CONTROL.search(failed) is None, failed[:200]
    assert len(failed) < 1500, len(failed)
    if fmt == "json":
        doc = json.loads(failed)
        assert doc["claim"] == "team-a/hostile"
        assert doc["error"].startswith(error[:100])  # JSON escaped the characters itself
        assert doc["error"].endswith(f"...({len(error)}_chars)")
    else:
        assert "claim=team-a/hostile" in failed
        for escaped in ("\\r", "\\x1b[2J", "\\u2028", "\\x85"):
            assert escaped in failed
        assert f"...({len(error)}_chars)" in failed
