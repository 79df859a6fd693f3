"""Through the daemon process: pods on the network cannot make the kubelet restart the agent.

100 slow clients (a byte of a request head now and then) and 100 idle keep-alive ones,
spread over 10 attacking pod addresses and reconnecting whenever they are dropped, run for
several head deadlines; meanwhile every `/healthz` and `/readyz` probe, on the probes' own
listener and on the scrape port alike, is answered 200. No timing is asserted: a probe that
got no answer within its 10 s bound counts as a failure (code 0).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuslice.testing.envtest import free_port
from gpuslice.testing.http_attack import attack, attacker_addresses, probe, probe_while
from tests.e2e.daemon_fixtures import running_daemon

CONFIG = "version: v1\n"
HEAD_TIMEOUT_S = 1.0
ATTACK_S = 6.0
"""Six head deadlines: every attacking connection is dropped and reopened several times."""


async def test_probes_keep_answering_while_slow_and_idle_clients_reconnect(
    sock_dir: Path,
) -> None:
    metrics, health = free_port(), free_port()
    args = [
        "--no-labels",
        "--metrics-port",
        str(metrics),
        "--metrics-address",
        "127.0.0.1",
        "--health-port",
        str(health),
        "--http-head-timeout",
        str(HEAD_TIMEOUT_S),
        "--no-gpu-metrics",
    ]
    async with running_daemon(sock_dir, CONFIG, node="sim:1xt4", args=args) as node:
        for port in (metrics, health):
            for _ in range(100):
                if (await probe("127.0.0.1", port, "/readyz"))[0] == 200:
                    break
                await asyncio.sleep(0.1)
        stop = asyncio.Event()
        attackers = asyncio.ensure_future(
            attack(
                "127.0.0.1",
                metrics,
                slow=100,
                idle=100,
                sources=attacker_addresses(10),
                stop=stop,
                byte_every_s=0.5,
            )
        )
        probes = asyncio.ensure_future(probe_while("127.0.0.1", [health, metrics], stop))
        await asyncio.sleep(ATTACK_S)
        stop.set()
        stats, seen = await attackers, await probes
        assert stats.connections > 200, "the attackers reconnected after being dropped"
        assert stats.dropped > 0, "the head deadline closed slow and idle clients"
        assert stats.refused > 0, "10 addresses x 20 clients meet the per-address cap of 16"
        assert seen.codes, "probes were sent"
        assert set(seen.codes) == {200}, f"probe answers under attack: {sorted(set(seen.codes))}"
        assert node.daemon.running
