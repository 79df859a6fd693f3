"""Hostile HTTP clients for the agent's endpoint: what a pod on the cluster network can do.

Slow clients send a request head a byte at a time; idle ones open a keep-alive connection
and say nothing (or one request, then nothing). Every client reconnects as soon as the
server drops it, as an attacker would, so the load never lets up. Clients spread over
several loopback source addresses (`127.0.0.2`, `127.0.0.3`, ...) stand for several pods;
probes sent from `127.0.0.1` stand for the kubelet. Used by the end-to-end test and by
`bench/faults_probes.py`; every loop is bounded by `stop`, and nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

_SLOW_HEAD = b"GET /metrics HTTP/1.1\r\nHost: agent\r\nUser-Agent: " + b"s" * 4000


@dataclass
class AttackStats:
    connections: int = 0
    """Connections the attackers opened (reconnections included)."""
    refused: int = 0
    """Connections answered 503 at once (over a cap)."""
    dropped: int = 0
    """Connections the server closed (no 503) while the attacker still held them."""
    reset: int = 0
    """Connections reset by the server (closed with the attacker's bytes unread)."""


@dataclass
class ProbeStats:
    codes: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)


def attacker_addresses(count: int) -> list[str]:
    """`count` loopback addresses other than 127.0.0.1, one per attacking pod."""
    return [f"127.0.{n // 250}.{2 + n % 250}" for n in range(count)]


async def _one_client(
    host: str, port: int, source: str, slow: bool, byte_every_s: float, stats: AttackStats
) -> None:
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    stats.connections += 1
    try:
        if slow:
            for byte in _SLOW_HEAD:
                writer.write(bytes([byte]))
                await writer.drain()
                if reader.at_eof():
                    break
                await asyncio.sleep(byte_every_s)
        else:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
            await writer.drain()
        data = await reader.read()  # held open until the server closes it
        if data.startswith(b"HTTP/1.1 503"):
            stats.refused += 1
        else:
            stats.dropped += 1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _client_loop(
    host: str,
    port: int,
    source: str,
    slow: bool,
    byte_every_s: float,
    stats: AttackStats,
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        try:
            await _one_client(host, port, source, slow, byte_every_s, stats)
        except (ConnectionError, OSError):
            stats.reset += 1
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.01)  # reconnect at once, but do not spin


async def attack(
    host: str,
    port: int,
    *,
    slow: int,
    idle: int,
    sources: Sequence[str],
    stop: asyncio.Event,
    byte_every_s: float = 4.0,
) -> AttackStats:
    """Run `slow` slow and `idle` idle reconnecting clients, spread over `sources`, until
    `stop` is set; then close them all."""
    stats = AttackStats()
    tasks = [
        asyncio.ensure_future(
            _client_loop(host, port, sources[i % len(sources)], i < slow, byte_every_s, stats, stop)
        )
        for i in range(slow + idle)
    ]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return stats


async def probe(host: str, port: int, path: str, timeout_s: float = 10.0) -> tuple[int, float]:
    """One probe as the kubelet sends it (a new connection, `Connection: close`): its HTTP
    status (0 when it got none) and how long it took."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(
                    f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
                )
                await writer.drain()
                status_line = await reader.readline()
            finally:
                writer.close()
        parts = status_line.split()
        code = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    except (TimeoutError, ConnectionError, OSError):
        code = 0
    return code, time.perf_counter() - start


async def probe_while(
    host: str, ports: Sequence[int], stop: asyncio.Event, every_s: float = 0.2
) -> ProbeStats:
    """`/healthz` and `/readyz` on each port, one after another, until `stop` is set."""
    stats = ProbeStats()
    while not stop.is_set():
        for port in ports:
            for path in ("/healthz", "/readyz"):
                code, took = await probe(host, port, path)
                stats.codes.append(code)
                stats.latencies_s.append(took)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
    return stats
