"""Workloads known by construction, written once per module as OpenMetrics text."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.testing.workloads import idle_node, six_pods_and_a_leaker, write_openmetrics
from tests.core.advise.advise_cases import END


@pytest.fixture(scope="session")
def samples_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A leaking H100 node and an idle L40S node in one file."""
    path = tmp_path_factory.mktemp("advise") / "samples.om"
    with path.open("w") as out:
        write_openmetrics([six_pods_and_a_leaker(END), idle_node(END)], out)
    return path
