"""What an operator looks for: every `plugin --help` option explained with its variable, the
version everywhere they look (`-V`, the start-up line, `/status`, `gpuslice_build_info`),
and the libraries' request lines kept out of the INFO log."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpuslice import __version__
from gpuslice.cli.logsetup import setup_logging
from gpuslice.cli.main import main
from gpuslice.cli.plugin import plugin
from gpuslice.cli.top import fetch_status
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from tests.e2e.metrics_support import samples, wait_scrape


def test_every_plugin_option_has_help_and_shows_its_variable() -> None:
    ctx = click.Context(plugin, terminal_width=10_000, max_content_width=10_000)
    missing_help, missing_env = [], []
    for param in plugin.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        record = param.get_help_record(ctx)
        assert record is not None
        opts, text = record
        if not text or text.startswith("["):  # only the bracketed extras: no help of its own
            missing_help.append(opts)
        if param.envvar and f"env var: {param.envvar}" not in text:
            missing_env.append(opts)
    assert missing_help == []
    assert missing_env == []


def test_dash_v_prints_the_version() -> None:
    result = CliRunner().invoke(main, ["-V"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"gpuslice, version {__version__}"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("restored_logging")
@pytest.mark.parametrize("verbose", [False, True])
@pytest.mark.parametrize("library", ["httpx", "httpx2"])  # httpx2: lightkube's, the agent's
def test_library_request_lines_are_debug(
    verbose: bool, library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    setup_logging("json", verbose=verbose)
    logging.getLogger(library).info('HTTP Request: GET https://api/nodes "HTTP/1.1 200 OK"')
    logging.getLogger("gpuslice.test").info("event=ours")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    requests = [d for d in lines if d["logger"] == library]
    assert [d["event"] for d in lines if d["logger"] == "gpuslice.test"] == ["ours"]
    if verbose:
        assert [d["level"] for d in requests] == ["debug"]
    else:
        assert requests == []


async def test_the_version_is_in_the_start_line_status_and_metrics(sock_dir: Path) -> None:
    port = free_port()
    plugin_dir = sock_dir / "dp"
    plugin_dir.mkdir()
    daemon = DaemonProcess(
        [
            "--node",
            "sim:1xt4",
            "--device-plugin-path",
            str(plugin_dir),
            "--kubelet-socket",
            "",
            "--no-compute-mode",
            "--no-labels",
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--metrics-interval",
            "0.2",
            "--pod-resources-socket",
            str(sock_dir / "none.sock"),
        ],
        log_path=sock_dir / "daemon.log",
    )
    await daemon.start()
    try:
        text = await wait_scrape(port, lambda t: "gpuslice_build_info" in t, "build info")
        assert samples(text, "gpuslice_build_info") == [({"version": __version__}, 1.0)]
        status = await asyncio.to_thread(fetch_status, f"http://127.0.0.1:{port}")
        assert status["agent_version"] == __version__
        # written before anything is served
        assert f"event=starting version={__version__}" in daemon.log(), daemon.log()
    finally:
        assert await daemon.terminate() == 0, daemon.log()
