#!/usr/bin/env python3
"""The kubelet's probes while pods attack the agent's HTTP endpoint, through the real daemon.

One `gpuslice plugin` process on `sim:1xt4` with the kubelet emulator, its metrics port
and its probe listener (`--health-port`) on loopback. Measured in one run:

- baseline: `/healthz` and `/readyz` on the probe listener, one new connection each (as the
  kubelet probes), with nothing else going on;
- under attack: the same probes while 100 slow clients (a byte of a request head every
  4 s) and 100 idle keep-alive ones, spread over 10 loopback addresses standing for pods
  and reconnecting whenever they are dropped, hold the metrics port; the same probes on
  the metrics port too (the kubelet's address has its own per-address share there).

It reports p50 and p99 probe latency under attack as multiples of the baseline p50, the
worst probe in seconds against the goal (every probe under 2 s), and how many probes were
answered other than 200 (goal: none). Attack length: 60 s; `--quick`: 3 s.

    .venv/bin/python bench/faults_probes.py [--quick]

`bench_faults.py` runs it as one of its scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port
from gpuslice.testing.http_attack import ProbeStats, attack, attacker_addresses, probe, probe_while

GOAL_S = 2.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _probes_for(ports: list[int], seconds: float) -> ProbeStats:
    stop = asyncio.Event()
    task = asyncio.ensure_future(probe_while("127.0.0.1", ports, stop, every_s=0.1))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


async def scenario_probes(quick: bool) -> str:
    """Runs the scenario, prints its table and returns its one-line summary."""
    seconds = 3.0 if quick else 60.0
    with tempfile.TemporaryDirectory(prefix="gs-probes-", dir="/tmp") as tmp:
        work = Path(tmp)
        plugin_dir = work / "dp"
        plugin_dir.mkdir()
        (work / "config.yaml").write_text("version: v1\n", encoding="utf-8")
        metrics, health = free_port(), free_port()
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        daemon = DaemonProcess(
            [
                "--node",
                "sim:1xt4",
                "--config-file",
                str(work / "config.yaml"),
                "--device-plugin-path",
                str(plugin_dir),
                "--no-compute-mode",
                "--no-labels",
                "--no-gpu-metrics",
                "--metrics-port",
                str(metrics),
                "--metrics-address",
                "127.0.0.1",
                "--health-port",
                str(health),
            ],
            log_path=work / "daemon.log",
            env={"GPUSLICE_SIM_CONTROL_DIR": str(work / "ctl")},
        )
        await daemon.start()
        try:
            for _ in range(300):
                if (await probe("127.0.0.1", health, "/readyz"))[0] == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise SystemExit(f"the daemon never got ready:\n{daemon.log()}")
            base = await _probes_for([health], min(seconds, 5.0))
            stop = asyncio.Event()
            attackers = asyncio.ensure_future(
                attack(
                    "127.0.0.1",
                    metrics,
                    slow=100,
                    idle=100,
                    sources=attacker_addresses(10),
                    stop=stop,
                )
            )
            await asyncio.sleep(0.5)  # let the attackers take their connections
            on_health = asyncio.ensure_future(_probes_for([health], seconds))
            on_metrics = asyncio.ensure_future(_probes_for([metrics], seconds))
            loaded, loaded_metrics = await on_health, await on_metrics
            stop.set()
            stats = await attackers
            alive = daemon.running
        finally:
            await daemon.terminate()
            await kubelet.stop()
    base_p50 = statistics.median(base.latencies_s)
    rows = [("none (baseline)", base), ("attack, probe port", loaded)]
    rows.append(("attack, metrics port", loaded_metrics))
    print(f"\nprobes under attack ({seconds:g} s; {stats.connections} attacking connections,")
    print(
        f"{stats.refused} refused over a cap, {stats.dropped} closed by a deadline, "
        f"{stats.reset} reset)"
    )
    print(f"{'load':<24}{'probes':>8}{'not 200':>9}{'p50 x':>8}{'p99 x':>8}{'worst s':>9}")
    for name, s in rows:
        bad = sum(1 for c in s.codes if c != 200)
        p50, p99 = statistics.median(s.latencies_s), pct(s.latencies_s, 0.99)
        print(
            f"{name:<24}{len(s.codes):>8}{bad:>9}{p50 / base_p50:>8.1f}{p99 / base_p50:>8.1f}"
            f"{max(s.latencies_s):>9.3f}"
        )
    worst = max(max(loaded.latencies_s), max(loaded_metrics.latencies_s))
    failed = sum(1 for c in loaded.codes + loaded_metrics.codes if c != 200)
    summary = (
        f"probes under 100 slow + 100 idle reconnecting clients: p99 "
        f"{pct(loaded.latencies_s, 0.99) / base_p50:.1f}x an unloaded probe, worst "
        f"{worst:.2f} s (goal < {GOAL_S:g} s), {failed} not answered 200, daemon "
        f"{'running' if alive else 'DOWN'}"
    )
    print(summary)
    if failed or not alive:
        raise SystemExit("a probe went unanswered under attack")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a 3 s attack instead of 60 s")
    summary = asyncio.run(scenario_probes(parser.parse_args().quick))
    print(f"Closing note: {summary}.", file=sys.stdout)


if __name__ == "__main__":
    main()
