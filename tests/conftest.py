"""Shared fixtures: short socket dirs, task-leak detection, per-test timeouts (pyproject)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/backends/conftest.py: only root conftests may add options when
    # pytest runs from the repository root.
    parser.addoption(
        "--with-gpu",
        action="store_true",
        default=False,
        help="also run tests that need an NVIDIA GPU and driver (NVML backend contract)",
    )


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short temp dir for unix sockets: socket paths must stay under ~107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail any test that leaves asyncio tasks running behind it."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [
        t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()
    ]
    for t in leaked:
        t.cancel()
    assert not leaked, f"test leaked asyncio tasks: {[t.get_name() for t in leaked]}"
