"""Idle footprint of the real daemon: CPU (% of one core) and RSS with nothing happening.

The daemon runs as its own process (`gpuslice plugin`, as the DaemonSet runs it) on
`sim:8xh100-80gb` with 128 time-slicing replicas per GPU (1,024 devices), metrics on, GFD
labels to a file, and the kubelet emulator (this process) holding ListAndWatch open. Once
every device is advertised and a settle period passed, CPU is read from
`/proc/<pid>/stat` (utime + stime) over the window, and RSS from `/proc/<pid>/status`.

Baseline, measured in the same run over the same window: a Python process running an
asyncio loop that does nothing (`asyncio.run(asyncio.Event().wait())`). Figures are given
as ratios to it and against the issue's targets (< 0.3 % of one core, < 80 MiB RSS).

`--sim-control` also gives the simulator a control directory, as the end-to-end tests do
(it then watches that directory); without it the backend is a plain simulated node.

    .venv/bin/python bench/bench_idle.py [--window 20] [--settle 5] [--sim-control]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.testing.daemon import DaemonProcess

RESOURCE = "nvidia.com/gpu"
DEVICES = 1024
CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 128\n"
)
TARGET_CPU_PCT = 0.3
TARGET_RSS_MIB = 80.0
TICK = os.sysconf("SC_CLK_TCK")
BASELINE = "import asyncio; asyncio.run(asyncio.Event().wait())"


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(window_s: float, settle_s: float, sim_control: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="gsbi-", dir="/tmp") as tmp:
        work = Path(tmp)
        plugin_dir = work / "dp"
        plugin_dir.mkdir()
        (work / "config.yaml").write_text(CONFIG)
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        env = {"GPUSLICE_SIM_CONTROL_DIR": str(work / "ctl")} if sim_control else {}
        daemon = DaemonProcess(
            [
                "--node",
                "sim:8xh100-80gb",
                "--config-file",
                str(work / "config.yaml"),
                "--device-plugin-path",
                str(plugin_dir),
                "--labels-file",
                str(work / "gfd.txt"),
                "--metrics-port",
                str(free_port()),
                "--pod-resources-socket",
                str(work / "no-kubelet-pr.sock"),
            ],
            log_path=work / "daemon.log",
            env=env,
        )
        baseline = await asyncio.create_subprocess_exec(sys.executable, "-c", BASELINE)
        await daemon.start()
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == DEVICES, 60)
            await asyncio.sleep(settle_s)
            assert daemon.proc is not None
            pid = daemon.proc.pid
            d0, b0, t0 = cpu_ticks(pid), cpu_ticks(baseline.pid), time.monotonic()
            await asyncio.sleep(window_s)
            d1, b1, t1 = cpu_ticks(pid), cpu_ticks(baseline.pid), time.monotonic()
            d_rss, b_rss = rss_mib(pid), rss_mib(baseline.pid)
        finally:
            baseline.kill()
            await baseline.wait()
            code = await daemon.terminate()
            await kubelet.stop()
        if code != 0:
            print(daemon.log(), file=sys.stderr)
    elapsed = t1 - t0
    d_cpu = (d1 - d0) / TICK / elapsed * 100
    b_cpu = (b1 - b0) / TICK / elapsed * 100
    resolution = 1 / TICK / elapsed * 100
    mode = "with simulator control dir" if sim_control else "plain simulated node"
    print(f"idle {elapsed:.1f} s, 8 x H100 x 128 replicas = {DEVICES} devices, metrics on, {mode}")
    print(f"(CPU resolution: one tick = {resolution:.3f} % of one core over this window)")
    print(f"{'':<34} {'CPU % core':>10} {'RSS MiB':>9}")
    print(f"{'baseline: idle asyncio process':<34} {b_cpu:10.3f} {b_rss:9.1f}")
    print(f"{'gpuslice plugin daemon':<34} {d_cpu:10.3f} {d_rss:9.1f}")
    cpu_ratio = d_cpu / b_cpu if b_cpu > 0 else float("inf")
    print(
        f"daemon / baseline: CPU {cpu_ratio:.1f}x (baseline ticks {b1 - b0}), "
        f"RSS {d_rss / b_rss:.2f}x"
    )
    print(
        f"daemon / target: CPU {d_cpu / TARGET_CPU_PCT:.2f}x of {TARGET_CPU_PCT} %, "
        f"RSS {d_rss / TARGET_RSS_MIB:.2f}x of {TARGET_RSS_MIB:g} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--sim-control", action="store_true")
    args = parser.parse_args()
    if args.window <= 0 or args.settle < 0:
        parser.error("--window must be > 0 and --settle >= 0")
    asyncio.run(run(args.window, args.settle, args.sim_control))


if __name__ == "__main__":
    main()
