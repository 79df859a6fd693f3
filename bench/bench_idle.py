"""Idle footprint of the real daemon: CPU (% of one core) and RSS with nothing happening.

The daemon runs as its own process (`gpuslice plugin`, as the DaemonSet runs it) on
`sim:8xh100-80gb` with 128 time-slicing replicas per GPU (1,024 devices), metrics on, GFD
labels to a file, and the kubelet emulator (this process) holding ListAndWatch open. Once
every device is advertised and a settle period passed, CPU is read from
`/proc/<pid>/stat` (utime + stime) over the window, and RSS from `/proc/<pid>/status`.

Baselines, measured in the same run over the same window: a Python process running an
asyncio loop that does nothing (`asyncio.run(asyncio.Event().wait())`), and one that also
runs an idle `grpc.aio` server on a unix socket (grpc's own threads: its timer thread,
event-engine workers and their lifeguard wake a few times a second on their own, and the
daemon cannot stop them). Figures are given as ratios to the asyncio process and against
the issue's goal (at most 0.1 % of one core, 64 MiB RSS, 2 wake-ups/s).

Wake-ups: context switches of all the process's threads over the window (per second), a
count that the clock tick's 10 ms resolution does not blur; split into grpc core's threads
(named `grpc_global_tim*`, `event_engine`, `lifeguard` by grpc) and gpuslice's own (every
other thread: the event loop, its executor workers, the watchdog, backend threads), the
part the daemon's code decides. `--threads` lists every thread's wake-ups.

`--sim-control` also gives the simulator a control directory, as the end-to-end tests do
(it then watches that directory); without it the backend is a plain simulated node.

`--nvml-stand-in` also runs a second daemon, same settings, on `--node nvml`, with
`bench/nvml_stand_in/` first on its PYTHONPATH: a stand-in `pynvml` modelling 8 idle H100s
whose event wait sleeps its whole timeout. It measures gpuslice's own wake-ups on the NVML
path (health wait slices, metrics and guard polls), not the driver's cost of each call.

    .venv/bin/python bench/bench_idle.py [--window 20] [--settle 5] [--sim-control]
        [--nvml-stand-in] [--threads] [--quick]

`--quick` (a 3 s window after 1 s): the smoke run CI does. One clock tick is then 0.3 % of
a core, three times the goal, so its CPU figure says the script works, nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port

RESOURCE = "nvidia.com/gpu"
DEVICES = 1024
CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 128\n"
)
TARGET_CPU_PCT = 0.1
TARGET_RSS_MIB = 64.0
TARGET_WAKES_S = 2.0
GRPC_THREADS = ("grpc_global_tim", "event_engine", "lifeguard")
"""Thread names (`/proc/<pid>/task/*/comm`) that grpc core gives its own threads."""
QUICK_WINDOW_S, QUICK_SETTLE_S = 3.0, 1.0
SIM_NODE = "sim:8xh100-80gb"
STAND_IN = Path(__file__).resolve().parent / "nvml_stand_in"
TICK = os.sysconf("SC_CLK_TCK")
BASELINE = "import asyncio; asyncio.run(asyncio.Event().wait())"
BASE = "baseline: idle asyncio process"
GRPC_BASE = "baseline: + idle grpc.aio server"
GRPC_BASELINE = """
import asyncio, sys, grpc

async def main():
    server = grpc.aio.server()
    server.add_insecure_port("unix://" + sys.argv[1])
    await server.start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


def ready(kubelet: KubeletEmulator) -> bool:
    return kubelet.allocatable(RESOURCE) == DEVICES


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def thread_switches(pid: int) -> dict[str, tuple[str, int]]:
    """Context switches so far of each thread of `pid` (tid -> name, count): each is a
    wake-up or a preemption, a count that does not depend on the clock tick's resolution."""
    out: dict[str, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended
            continue
        count = 0
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                count += int(line.split()[1])
        out[task.name] = (name, count)
    return out


@dataclass(frozen=True, slots=True)
class Wakes:
    total: int
    grpc: int
    per_thread: dict[str, tuple[str, int]]

    @property
    def own(self) -> int:
        return self.total - self.grpc


def wakeups(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> Wakes:
    """Switches between two `thread_switches` readings, grpc core's threads apart. A thread
    that ended in between is not counted; one that began counts from zero."""
    per_thread = {
        tid: (name, count - before.get(tid, (name, 0))[1]) for tid, (name, count) in after.items()
    }
    grpc_part = sum(n for name, n in per_thread.values() if name.startswith(GRPC_THREADS))
    return Wakes(sum(n for _, n in per_thread.values()), grpc_part, per_thread)


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


async def run(
    window_s: float, settle_s: float, sim_control: bool, nvml_stand_in: bool, threads: bool
) -> None:
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
        baselines = {
            BASE: await asyncio.create_subprocess_exec(sys.executable, "-c", BASELINE),
            GRPC_BASE: await asyncio.create_subprocess_exec(
                sys.executable, "-c", GRPC_BASELINE, str(work / "grpc.sock")
            ),
        }
        codes: dict[str, int] = {}
        try:
            for daemon in daemons.values():
                await daemon.start()
            for kubelet in kubelets.values():
                await kubelet.wait_for(partial(ready, kubelet), 60)
            await asyncio.sleep(settle_s)
            pids = {name: b.pid for name, b in baselines.items()}
            pids |= {name: d.proc.pid for name, d in daemons.items() if d.proc is not None}
            t0 = time.monotonic()
            ticks0 = {name: cpu_ticks(pid) for name, pid in pids.items()}
            switches0 = {name: thread_switches(pid) for name, pid in pids.items()}
            await asyncio.sleep(window_s)
            switches1 = {name: thread_switches(pid) for name, pid in pids.items()}
            ticks1 = {name: cpu_ticks(pid) for name, pid in pids.items()}
            t1 = time.monotonic()
            rss = {name: rss_mib(pid) for name, pid in pids.items()}
        finally:
            for proc in baselines.values():
                proc.kill()
                await proc.wait()
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
    ticks = {name: ticks1[name] - ticks0[name] for name in pids}
    cpu = {name: n / TICK / elapsed * 100 for name, n in ticks.items()}
    wakes = {name: wakeups(switches0[name], switches1[name]) for name in pids}
    total = {name: w.total / elapsed for name, w in wakes.items()}
    own = {name: w.own / elapsed for name, w in wakes.items()}
    resolution = 1 / TICK / elapsed * 100
    mode = "simulator with control dir" if sim_control else "plain simulated node"
    print(f"idle {elapsed:.1f} s, 8 x H100 x 128 replicas = {DEVICES} devices, metrics on, {mode}")
    print(f"(CPU resolution: one tick = {resolution:.3f} % of one core over this window)")
    print(f"{'':<38} {'CPU % core':>10} {'RSS MiB':>9} {'wakes/s':>8} {'own':>6} {'grpc':>6}")
    for name in pids:
        label = name if name in baselines else f"daemon, {name}"
        print(
            f"{label:<38} {cpu[name]:10.3f} {rss[name]:9.1f} {total[name]:8.1f} "
            f"{own[name]:6.1f} {total[name] - own[name]:6.1f}"
        )
        if threads:
            for tid, (thread, n) in sorted(wakes[name].per_thread.items()):
                print(f"    thread {tid:>8} {thread:<16} {n / elapsed:6.1f} wake-ups/s")
    b_cpu, b_rss, b_ticks = cpu[BASE], rss[BASE], ticks[BASE]
    closing = []
    for name in daemons:
        if name not in pids:
            continue
        cpu_ratio = f"{cpu[name] / b_cpu:.1f}x" if b_cpu > 0 else "infx"
        print(
            f"{name}: / baseline: CPU {cpu_ratio} (ticks {ticks[name]} vs {b_ticks}), RSS "
            f"{rss[name] / b_rss:.2f}x, wake-ups {total[name] - total[GRPC_BASE]:+.1f}/s over "
            f"the idle grpc.aio server; / goal: CPU {cpu[name] / TARGET_CPU_PCT:.2f}x of "
            f"{TARGET_CPU_PCT} %, RSS {rss[name] / TARGET_RSS_MIB:.2f}x of {TARGET_RSS_MIB:g} "
            f"MiB, wake-ups {total[name] / TARGET_WAKES_S:.2f}x (gpuslice's own threads "
            f"{own[name] / TARGET_WAKES_S:.2f}x) of {TARGET_WAKES_S:g}/s"
        )
        closing.append(
            f"{name.split(' ')[0]} daemon CPU {cpu[name] / TARGET_CPU_PCT:.2f}x the "
            f"{TARGET_CPU_PCT} % goal, RSS {rss[name] / b_rss:.2f}x the idle asyncio process "
            f"({rss[name] / TARGET_RSS_MIB:.2f}x the {TARGET_RSS_MIB:g} MiB goal), "
            f"{total[name]:.1f} wake-ups/s ({total[name] / TARGET_WAKES_S:.2f}x the "
            f"{TARGET_WAKES_S:g}/s goal; gpuslice's own threads {own[name]:.1f}/s, "
            f"{own[name] / TARGET_WAKES_S:.2f}x)"
        )
    print(
        f"Closing note: idle over {elapsed:.1f} s, "
        + "; ".join(closing)
        + f"; an idle grpc.aio server alone wakes {total[GRPC_BASE]:.1f}/s "
        f"({rss[GRPC_BASE] / b_rss:.2f}x the asyncio process's RSS)."
    )


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
    parser.add_argument("--threads", action="store_true", help="list each thread's wake-ups")
    parser.add_argument(
        "--quick", action="store_true", help="--window 3 --settle 1: a smoke run, not a figure"
    )
    args = parser.parse_args()
    if args.quick:
        args.window, args.settle = QUICK_WINDOW_S, QUICK_SETTLE_S
    if args.window <= 0 or args.settle < 0:
        parser.error("--window must be > 0 and --settle >= 0")
    asyncio.run(run(args.window, args.settle, args.sim_control, args.nvml_stand_in, args.threads))


if __name__ == "__main__":
    main()
