"""Idle footprint of the real daemon: CPU (% of one core) and RSS with nothing happening.

The daemon runs as its own process (`gpuslice plugin`, as the DaemonSet runs it) on
`sim:8xh100-80gb` with 128 time-slicing replicas per GPU (1,024 devices), metrics on, GFD
labels to a file, and the kubelet emulator (this process) holding ListAndWatch open. Once
every device is advertised and a settle period passed, CPU is read from
`/proc/<pid>/stat` (utime + stime) over the window, and RSS from `/proc/<pid>/status`.

Baseline, measured in the same run over the same window: a Python process running an
asyncio loop that does nothing (`asyncio.run(asyncio.Event().wait())`). Figures are given
as ratios to it and against the issue's targets (< 0.3 % of one core, < 80 MiB RSS).

Wake-ups: context switches of all the process's threads over the window (per second), a
count that the clock tick's 10 ms resolution does not blur.

`--sim-control` also gives the simulator a control directory, as the end-to-end tests do
(it then watches that directory); without it the backend is a plain simulated node.

`--nvml-stand-in` also runs a second daemon, same settings, on `--node nvml`, with
`bench/nvml_stand_in/` first on its PYTHONPATH: a stand-in `pynvml` modelling 8 idle H100s
whose event wait sleeps its whole timeout. It measures gpuslice's own wake-ups on the NVML
path (health wait slices, metrics and guard polls), not the driver's cost of each call.

    .venv/bin/python bench/bench_idle.py [--window 20] [--settle 5] [--sim-control]
        [--nvml-stand-in] [--quick]

`--quick` (a 3 s window after 1 s): the smoke run CI does. One clock tick is then 0.3 % of
a core, the whole target, so its CPU figure says the script works, nothing more.
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
QUICK_WINDOW_S, QUICK_SETTLE_S = 3.0, 1.0
SIM_NODE = "sim:8xh100-80gb"
STAND_IN = Path(__file__).resolve().parent / "nvml_stand_in"
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


def wakeups(pid: int) -> int:
    """Context switches of every thread of `pid` so far: each is a wake-up or a preemption,
    a count that does not depend on the clock tick's resolution."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split()[1])
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_for(work: Path, node: str, env: dict[str, str]) -> DaemonProcess:
    work.mkdir()
    (work / "dp").mkdir()
    (work / "config.yaml").write_text(CONFIG)
    return DaemonProcess(
        [
            "--node",
            node,
            "--config-file",
            str(work / "config.yaml"),
            "--device-plugin-path",
            str(work / "dp"),
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


async def run(window_s: float, settle_s: float, sim_control: bool, nvml_stand_in: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="gsbi-", dir="/tmp") as tmp:
        work = Path(tmp)
        sim_env = {"GPUSLICE_SIM_CONTROL_DIR": str(work / "ctl")} if sim_control else {}
        daemons = {"simulated (sim:8xh100-80gb)": daemon_for(work / "sim", SIM_NODE, sim_env)}
        if nvml_stand_in:
            path = os.pathsep.join(
                p for p in (str(STAND_IN), os.environ.get("PYTHONPATH", "")) if p
            )
            daemons["nvml (pynvml stand-in)"] = daemon_for(
                work / "nvml", "nvml", {"PYTHONPATH": path}
            )
        # one kubelet per daemon: each registers the same resource name
        kubelets = {name: KubeletEmulator(d.log_path.parent / "dp") for name, d in daemons.items()}
        for kubelet in kubelets.values():
            await kubelet.start()
        baseline = await asyncio.create_subprocess_exec(sys.executable, "-c", BASELINE)
        codes: dict[str, int] = {}
        try:
            for daemon in daemons.values():
                await daemon.start()
            for kubelet in kubelets.values():
                await kubelet.wait_for(lambda k=kubelet: k.allocatable(RESOURCE) == DEVICES, 60)
            await asyncio.sleep(settle_s)
            pids = {name: d.proc.pid for name, d in daemons.items() if d.proc is not None}
            b0, t0 = cpu_ticks(baseline.pid), time.monotonic()
            before = {name: cpu_ticks(pid) for name, pid in pids.items()}
            w0 = {name: wakeups(pid) for name, pid in pids.items()}
            bw0 = wakeups(baseline.pid)
            await asyncio.sleep(window_s)
            bw1 = wakeups(baseline.pid)
            w1 = {name: wakeups(pid) for name, pid in pids.items()}
            after = {name: cpu_ticks(pid) for name, pid in pids.items()}
            b1, t1 = cpu_ticks(baseline.pid), time.monotonic()
            rss = {name: rss_mib(pid) for name, pid in pids.items()}
            b_rss = rss_mib(baseline.pid)
        finally:
            baseline.kill()
            await baseline.wait()
            for name, daemon in daemons.items():
                codes[name] = await daemon.terminate()
            for kubelet in kubelets.values():
                await kubelet.stop()
            for name, daemon in daemons.items():
                if codes.get(name) != 0:
                    print(f"--- {name} exited {codes.get(name)}:", file=sys.stderr)
                    print(daemon.log(), file=sys.stderr)
            if any(code != 0 for code in codes.values()):
                raise SystemExit("a daemon did not exit cleanly: its figures are not an idle one's")
    elapsed = t1 - t0
    b_cpu = (b1 - b0) / TICK / elapsed * 100
    resolution = 1 / TICK / elapsed * 100
    mode = "simulator with control dir" if sim_control else "plain simulated node"
    print(f"idle {elapsed:.1f} s, 8 x H100 x 128 replicas = {DEVICES} devices, metrics on, {mode}")
    print(f"(CPU resolution: one tick = {resolution:.3f} % of one core over this window)")
    print(f"{'':<38} {'CPU % core':>10} {'RSS MiB':>9} {'wakes/s':>8}")
    b_wakes = (bw1 - bw0) / elapsed
    print(f"{'baseline: idle asyncio process':<38} {b_cpu:10.3f} {b_rss:9.1f} {b_wakes:8.1f}")
    closing = []
    for name in pids:
        d_cpu = (after[name] - before[name]) / TICK / elapsed * 100
        d_rss = rss[name]
        cpu_ratio = d_cpu / b_cpu if b_cpu > 0 else float("inf")
        d_wakes = (w1[name] - w0[name]) / elapsed
        print(f"{'daemon, ' + name:<38} {d_cpu:10.3f} {d_rss:9.1f} {d_wakes:8.1f}")
        print(
            f"  / baseline: CPU {cpu_ratio:.1f}x (ticks {after[name] - before[name]} vs "
            f"{b1 - b0}), RSS {d_rss / b_rss:.2f}x; / target: CPU "
            f"{d_cpu / TARGET_CPU_PCT:.2f}x of {TARGET_CPU_PCT} %, "
            f"RSS {d_rss / TARGET_RSS_MIB:.2f}x of {TARGET_RSS_MIB:g} MiB"
        )
        closing.append(
            f"{name.split(' ')[0]} daemon CPU {d_cpu / TARGET_CPU_PCT:.2f}x the "
            f"{TARGET_CPU_PCT} % target, RSS {d_rss / b_rss:.2f}x the idle asyncio process "
            f"({d_rss / TARGET_RSS_MIB:.2f}x the {TARGET_RSS_MIB:g} MiB target), "
            f"{d_wakes:.1f} wake-ups/s"
        )
    print(f"Closing note: idle over {elapsed:.1f} s, " + "; ".join(closing) + ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--sim-control", action="store_true")
    parser.add_argument(
        "--nvml-stand-in",
        action="store_true",
        help="also measure a daemon on --node nvml over bench/nvml_stand_in/pynvml.py",
    )
    parser.add_argument(
        "--quick", action="store_true", help="--window 3 --settle 1: a smoke run, not a figure"
    )
    args = parser.parse_args()
    if args.quick:
        args.window, args.settle = QUICK_WINDOW_S, QUICK_SETTLE_S
    if args.window <= 0 or args.settle < 0:
        parser.error("--window must be > 0 and --settle >= 0")
    asyncio.run(run(args.window, args.settle, args.sim_control, args.nvml_stand_in))


if __name__ == "__main__":
    main()
