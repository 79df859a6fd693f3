"""Telling a simulated backend in another process what happens to its GPUs.

End-to-end tests run the daemon as a subprocess, so they cannot call `inject_xid` on its
backend object. Instead the backend polls a control directory, named by the node file's
`controlDir` or by the daemon's `GPUSLICE_SIM_CONTROL_DIR` (`open_backend(control_dir=...)`)::

    <dir>/events/<sortable-name>.json     one command per file, applied once, then deleted

Writers create `<dir>/events/.<name>.tmp` and rename it into place, so the backend never
reads half a file; names sort by creation time, so commands apply in order. A file that is
not valid is renamed to `<name>.rejected` (and logged) rather than silently dropped.

Commands (`gpu` is a GPU UUID or index; `mig` a MIG device UUID or index under that GPU)::

    {"kind": "xid", "gpu": 0, "xid": 79, "giId": null, "ciId": null}
    {"kind": "recovered", "gpu": "GPU-..."}
    {"kind": "lost", "gpu": 1}
    {"kind": "add_process", "pid": 4242, "gpu": 0, "mig": null, "usedMemoryMiB": 512,
     "smUtil": 30, "mps": false, "cgroup": null}
        Sent again with the same pid and GPU, it sets the process's used memory.
    {"kind": "grow_process", "pid": 4243, "gpu": 0, "startMiB": 2048, "rateMiBPerS": 256,
     "targetMiB": null, "burstMiB": 0, "burstEveryS": 0, "burstS": 0, "cgroup": null}
    {"kind": "remove_process", "pid": 4242}
        `cgroup`: the full sysfs path of the cgroup the process runs in (a container's), or
        null. The driver charges a cgroup its processes' memory: the limits' read-back
        reports it as `used`, and a growing process fails its own allocation past its
        cgroup's hard limit. A fixed-size process holds what it is told, limits or not: the
        memory a container allocated before its limits were set (inside the window), which
        the driver keeps (what it does then is not documented).
    {"kind": "set_limits", "gpu": 0, "cgroup": "/sys/fs/cgroup/...", "softMiB": 11517,
     "hardMiB": 11517}
    {"kind": "clear_limits", "gpu": 0, "cgroup": "/sys/fs/cgroup/..."}
        Someone other than the agent sets a cgroup's limits on a GPU (`hardMiB` null: no
        hard limit) or clears them: the drift the agent's read-back must find and repair.
    {"kind": "cgroup_removed", "cgroup": "/sys/fs/cgroup/..."}
        The cgroup went: the driver forgets its limits on every GPU.
    {"kind": "fail_limits", "gpu": 0, "error": "GPU is lost"}
        The limit calls on one GPU fail with that NVML error from now on (`error` null:
        they succeed again): what the agent's back-off and the hook's variables must see.
    {"kind": "set_status", "gpu": 0, "gpuUtil": 80, "memoryUtil": 40, "temperatureC": 61,
     "powerW": 212.5}
    {"kind": "mig", "gpu": 0, "enabled": true, "layout": "1g.10gb*7"}
        MIG mode and layout changed on a live node (the inventory changes; the agent's
        periodic re-read picks it up). `layout` uses the node spec's syntax; null or ""
        with `enabled: true` is MIG mode with no instances.
    {"kind": "create_mig", "gpu": 0, "profile": "3g.40gb", "start": 4}
    {"kind": "destroy_mig", "gpu": 0, "mig": "MIG-..."}
        One MIG device made or destroyed by hand (`nvidia-smi mig -cgi ... -C`, `-dci`/`-dgi`),
        by the driver's rules (`simulated.partition`): someone else's instances, for
        dynamic MIG's tests and demo.

`ControlDir` writes them; the backend reads them with `take_commands`.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuslice.core.jsontypes import Json
from gpuslice.logs import get_logger

log = get_logger(__name__)


class ControlDir:
    """The writing side: what a test (or `gpuslice demo`) uses to drive a daemon's backend."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events = path / "events"
        self._seq = itertools.count()

    def send(self, command: Mapping[str, Any]) -> Path:
        self.events.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}"
        tmp = self.events / f".{name}.tmp"
        tmp.write_text(json.dumps(dict(command)), encoding="utf-8")
        final = self.events / f"{name}.json"
        os.replace(tmp, final)
        return final

    def inject_xid(
        self, gpu: str | int, xid: int, gi_id: int | None = None, ci_id: int | None = None
    ) -> Path:
        return self.send({"kind": "xid", "gpu": gpu, "xid": xid, "giId": gi_id, "ciId": ci_id})

    def inject_recovery(self, gpu: str | int) -> Path:
        return self.send({"kind": "recovered", "gpu": gpu})

    def inject_lost(self, gpu: str | int) -> Path:
        return self.send({"kind": "lost", "gpu": gpu})

    def add_process(
        self,
        pid: int,
        gpu: str | int,
        *,
        mig: str | int | None = None,
        used_memory_mib: int | None = None,
        sm_util_percent: int | None = None,
        mps: bool = False,
        cgroup: str | None = None,
    ) -> Path:
        """Also what sets a process's used memory: sent again for the same pid and GPU, it
        replaces the process (`cgroup`: see the module docstring)."""
        return self.send(
            {
                "kind": "add_process",
                "pid": pid,
                "gpu": gpu,
                "mig": mig,
                "usedMemoryMiB": used_memory_mib,
                "smUtil": sm_util_percent,
                "mps": mps,
                "cgroup": cgroup,
            }
        )

    def grow_process(
        self,
        pid: int,
        gpu: str | int,
        *,
        start_mib: int = 0,
        rate_mib_s: float = 0.0,
        target_mib: int | None = None,
        burst_mib: int = 0,
        burst_every_s: float = 0.0,
        burst_s: float = 0.0,
        cgroup: str | None = None,
    ) -> Path:
        """A process whose memory grows over time and dies of OOM when the GPU is full, or
        past its `cgroup`'s hard limit (see `memory.Allocation`)."""
        return self.send(
            {
                "kind": "grow_process",
                "pid": pid,
                "gpu": gpu,
                "startMiB": start_mib,
                "rateMiBPerS": rate_mib_s,
                "targetMiB": target_mib,
                "burstMiB": burst_mib,
                "burstEveryS": burst_every_s,
                "burstS": burst_s,
                "cgroup": cgroup,
            }
        )

    def set_limits(
        self, gpu: str | int, cgroup: str, *, soft_mib: int, hard_mib: int | None
    ) -> Path:
        """Limits set on a cgroup by someone else than the agent (`hard_mib` None: none)."""
        return self.send(
            {
                "kind": "set_limits",
                "gpu": gpu,
                "cgroup": cgroup,
                "softMiB": soft_mib,
                "hardMiB": hard_mib,
            }
        )

    def clear_limits(self, gpu: str | int, cgroup: str) -> Path:
        return self.send({"kind": "clear_limits", "gpu": gpu, "cgroup": cgroup})

    def cgroup_removed(self, cgroup: str) -> Path:
        return self.send({"kind": "cgroup_removed", "cgroup": cgroup})

    def remove_process(self, pid: int) -> Path:
        return self.send({"kind": "remove_process", "pid": pid})

    def fail_limits(self, gpu: str | int, error: str | None) -> Path:
        """The limit calls on `gpu` fail with the NVML error `error` (None: succeed again)."""
        return self.send({"kind": "fail_limits", "gpu": gpu, "error": error})

    def set_status(
        self,
        gpu: str | int,
        *,
        gpu_util_percent: int | None = None,
        memory_util_percent: int | None = None,
        temperature_c: int | None = None,
        power_w: float | None = None,
    ) -> Path:
        return self.send(
            {
                "kind": "set_status",
                "gpu": gpu,
                "gpuUtil": gpu_util_percent,
                "memoryUtil": memory_util_percent,
                "temperatureC": temperature_c,
                "powerW": power_w,
            }
        )

    def set_mig(self, gpu: str | int, *, enabled: bool, layout: str | None = None) -> Path:
        return self.send({"kind": "mig", "gpu": gpu, "enabled": enabled, "layout": layout})

    def pending(self) -> list[Path]:
        """Commands not yet taken by the backend (tests wait for this to empty)."""
        if not self.events.is_dir():
            return []
        return sorted(self.events.glob("*.json"))

    def rejected(self) -> list[Path]:
        if not self.events.is_dir():
            return []
        return sorted(self.events.glob("*.rejected"))


def take_commands(events_dir: Path) -> list[tuple[Path, Json]]:
    """Read every waiting command, oldest first, rejecting unreadable ones.

    The caller deletes each file once applied (`done`) or rejects it; calls are serialised
    (one backend reads one directory).
    """
    try:
        names = sorted(p for p in events_dir.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return []
    out: list[tuple[Path, Json]] = []
    for path in names:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            reject(path, f"not JSON: {exc}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            reject(path, 'expected a JSON object with a "kind"')
            continue
        out.append((path, data))
    return out


def done(path: Path) -> None:
    path.unlink(missing_ok=True)


def reject(path: Path, reason: str) -> None:
    log.warning("sim-control-rejected", file=path.name, reason=reason)
    try:
        os.replace(path, path.with_suffix(".rejected"))
    except OSError:
        path.unlink(missing_ok=True)
