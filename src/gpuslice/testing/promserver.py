"""A real Prometheus holding recorded series, on loopback, for `advise`'s tests and bench.

Series are loaded the way Prometheus's own docs backfill history: `promtool tsdb
create-blocks-from openmetrics FILE DIR` writes TSDB blocks, and `prometheus` is started
on that directory with no scrape targets, so it serves exactly what was written. The
binaries are Debian's `prometheus` package (`scripts/check` installs it).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from gpuslice.testing.envtest import free_port

READY_TIMEOUT_S = 30.0


def missing() -> str | None:
    """Why a real Prometheus cannot run here, or None."""
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (Debian package `prometheus`)"
    return None


def create_blocks(openmetrics: Path, tsdb: Path, *, max_block_hours: int = 0) -> None:
    """`max_block_hours` above 2 makes fewer, longer blocks: promtool reads the whole
    file once per block it writes, so a week in 2-hour blocks reads it 84 times."""
    tsdb.mkdir(parents=True, exist_ok=True)
    longer = [f"--max-block-duration={max_block_hours}h"] if max_block_hours > 2 else []
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            *longer,
            str(openmetrics),
            str(tsdb),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )


@contextlib.contextmanager
def serving(tsdb: Path, workdir: Path) -> Iterator[str]:
    """Prometheus on `tsdb` at a free loopback port; yields its URL once it is ready."""
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=60d",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                tail = (workdir / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus exited {proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after {READY_TIMEOUT_S} s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
