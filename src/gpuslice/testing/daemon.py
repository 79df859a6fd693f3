"""Running `gpuslice plugin` as a separate process, the way the DaemonSet does.

End-to-end tests and benchmarks drive the real daemon through the kubelet emulator; this
module starts it with the current interpreter, keeps its log, and stops it with SIGTERM so
the shutdown path (sockets removed, streams ended) is exercised too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class DaemonProcess:
    args: Sequence[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        log = self.log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuslice",
                "plugin",
                *self.args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        finally:
            log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    async def terminate(self, grace_s: float = 15.0) -> int:
        """SIGTERM, then wait; SIGKILL only if it overstays (and say so via the return code)."""
        if self.proc is None:
            return 0
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), grace_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            return -9

    async def wait_exit(self, within_s: float) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), within_s)
