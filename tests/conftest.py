"""Shared fixtures: short socket dirs, task-leak detection, per-test timeouts (pyproject)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.testing.image import BASE_UNAVAILABLE, Buildah, default_cache

IMAGE_REPORT = pytest.StashKey[list[str]]()

# An agent started by a test (in this process or as a daemon, which inherits it) leaves the
# machine's mount table alone: the MPS shm tmpfs outlives the agent with its daemons, as on a
# node, and nothing would unmount it after the test. The tests of the mount turn it on.
os.environ["MPS_SHM_TMPFS"] = "false"


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/backends/conftest.py: only root conftests may add options when
    # pytest runs from the repository root.
    parser.addoption(
        "--with-gpu",
        action="store_true",
        default=False,
        help="also run tests that need an NVIDIA GPU and driver (NVML backend contract)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`node` marks the tests that run a real kubelet and containerd or build the image
    (`tests/real_node`, `tests/image`): a node's kubelet, containerd and buildah storage are
    one per machine, and its pods' cgroups and probes do not survive other tests' load and
    mounts beside them, so `scripts/check` runs them alone after the others
    (`GPUSLICE_TEST_WORKERS`)."""
    tests = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(tests / "real_node") or item.path.is_relative_to(
            tests / "image"
        ):
            item.add_marker(pytest.mark.node)


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


def _report(config: pytest.Config, line: str) -> None:
    config.stash.setdefault(IMAGE_REPORT, []).append(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist a worker hands its image lines to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["image_report"] = session.config.stash.get(IMAGE_REPORT, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller's side of `pytest_sessionfinish` (xdist calls it as a worker ends)."""
    lines = getattr(node, "workeroutput", {}).get("image_report", [])
    for line in lines:
        _report(node.config, line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(IMAGE_REPORT, [])
    if lines:
        terminalreporter.section("the gpuslice image")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def report_line(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to what the run prints about the image at its end, where CI logs keep
    it (sizes, build and deploy times)."""
    return lambda line: _report(request.config, line)


def image_unavailable() -> str | None:
    """Why scripts/build-image cannot run here, or None."""
    if os.name != "posix" or os.uname().sysname != "Linux":
        return "the image tests need Linux"
    if os.geteuid() != 0:
        return "buildah (chroot isolation) and runc need root here"
    for tool, package in (("buildah", "buildah"), ("runc", "runc"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; scripts/check installs it)"
    return None


@pytest.fixture(scope="session")
def gpuslice_image(request: pytest.FixtureRequest) -> Iterator[str]:
    """The node agent image, built by scripts/build-image once per run and shared by the
    image tests (tests/image) and the chart on a real kubelet (tests/real_node): a build is
    30-40 s with the base cached, minutes when mmdebstrap makes the base. Its tag, in the
    buildah storage `default_cache() / "storage"` (kept between runs for the base)."""
    why = image_unavailable()
    if why is not None:
        pytest.skip(why)
    buildah = Buildah(default_cache() / "storage")
    tag = f"localhost/gpuslice:test-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    done = buildah.build(tag)
    said = [line for line in done.stderr.splitlines() if line.startswith("build-image:")]
    if done.returncode == BASE_UNAVAILABLE:
        pytest.skip(said[-1] if said else done.stderr.strip()[-500:])
    assert done.returncode == 0, f"scripts/build-image failed:\n{done.stderr[-6000:]}"
    for line in said:
        _report(request.config, line)
    _report(request.config, f"image build (shared by the run) {time.monotonic() - started:.0f} s")
    try:
        yield tag
    finally:
        buildah("rmi", tag)
