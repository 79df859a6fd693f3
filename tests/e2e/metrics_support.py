"""The metrics endpoint as the e2e tests reach it: the daemon's config and fake /proc for one
attributed process, a scrape, its samples, and waits on a scrape or a status code."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuslice.testing.eventually import eventually_async

WAIT_S = 15.0
POD_UID = "0f3c2a4e-8b1d-4c5e-9a7f-1234567890ab"
CONTAINER_ID = "a" * 64
PID = 4242
CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def fake_proc(root: Path) -> Path:
    """A /proc with one containerd container process (systemd cgroup driver, cgroup v2)."""
    uid_ = POD_UID.replace("-", "_")
    cgroup = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid_}.slice/cri-containerd-{CONTAINER_ID}.scope\n"
    )
    (root / str(PID)).mkdir(parents=True)
    (root / str(PID) / "cgroup").write_text(cgroup)
    return root


async def scrape(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    return await asyncio.to_thread(get)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


async def wait_scrape(port: int, ok: Callable[[str], bool], what: str) -> str:
    """The first scrape that `ok` accepts; on a timeout the failure shows the last one."""
    last = [""]

    async def accepted() -> bool:
        try:
            last[0] = await scrape(port)
        except OSError:
            last[0] = ""
        return bool(last[0]) and ok(last[0])

    await eventually_async(
        accepted,
        what,
        timeout=WAIT_S,
        interval=0.1,
        explain=lambda: f"last scrape:\n{last[0][-3000:]}",
    )
    return last[0]


async def status_code(url: str) -> int:
    def fetch() -> int:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    return await asyncio.to_thread(fetch)


async def wait_code(url: str, code: int) -> None:
    last = [-1]

    async def answered() -> bool:
        last[0] = await status_code(url)
        return last[0] == code

    await eventually_async(
        answered,
        f"{url} to answer {code}",
        timeout=30.0,
        interval=0.1,
        explain=lambda: f"it answered {last[0]}",
    )
