"""The shared fixtures keep their promises: a test that leaks an asyncio task fails."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def test_a_leaked_task_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(
        """
        import asyncio

        async def test_leaks():
            asyncio.create_task(asyncio.sleep(30), name="forgotten")

        async def test_cleans_up():
            task = asyncio.create_task(asyncio.sleep(30))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # the leaking test passes its own body, then errors at the fixture's teardown
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.re_match_lines([r".*test leaked asyncio tasks: \['forgotten'\]"])
