"""Fixtures for DRA end-to-end tests: an API double and a short work dir per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuslice.testing.apiserver import FakeApiServer, running_apiserver


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        yield server
