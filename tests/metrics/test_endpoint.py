"""The agent's HTTP endpoint over real sockets: routes, probes, limits, no thread per client."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuslice.metrics import MetricsServer
from gpuslice.metrics.server import ServerLimits


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("gpuslice_test_things", "things", registry=reg).inc(3)
    return reg


async def get(url: str) -> tuple[int, str, str]:
    def fetch() -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()

    return await asyncio.to_thread(fetch)


async def test_routes_answer_and_anything_else_is_404() -> None:
    ready = [False]
    async with MetricsServer(
        registry(),
        host="127.0.0.1",
        ready=lambda: (ready[0], "ready\n" if ready[0] else "not registered yet\n"),
        status=lambda: {"node_name": "n1"},
    ) as server:
        base = server.base_url
        code, ctype, body = await get(f"{base}/metrics")
        assert code == 200
        assert ctype.startswith("text/plain")
        assert "gpuslice_test_things_total 3.0" in body
        assert (await get(f"{base}/healthz"))[0] == 200
        code, _, body = await get(f"{base}/readyz")
        assert (code, body) == (503, "not registered yet\n")
        ready[0] = True
        assert (await get(f"{base}/readyz"))[0] == 200
        code, ctype, body = await get(f"{base}/status")
        assert (code, ctype, json.loads(body)) == (200, "application/json", {"node_name": "n1"})
        for path in ("/", "/healthz/x", "/metricsx", "/favicon.ico"):
            assert (await get(base + path))[0] == 404, path


async def test_openmetrics_is_negotiated_by_prometheus_client() -> None:
    async with MetricsServer(registry(), host="127.0.0.1") as server:

        def fetch() -> str:
            req = urllib.request.Request(
                server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                return str(r.read().decode())

        assert (await asyncio.to_thread(fetch)).rstrip().endswith("# EOF")


async def test_idle_connections_hold_no_thread_and_the_limit_refuses_the_next() -> None:
    limits = ServerLimits(max_connections=300, idle_timeout_s=30.0)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        threads_before = threading.active_count()
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(300)]
        for _ in range(100):
            if server.open_connections == 300:
                break
            await asyncio.sleep(0.02)
        assert server.open_connections == 300
        assert threading.active_count() <= threads_before + 1, "no thread per connection"
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        reply = await asyncio.wait_for(reader.read(), 5)
        assert reply.startswith(b"HTTP/1.1 503")
        writer.close()
        for _, w in idle:
            w.close()
        # the slots come back: a scrape works again
        for _ in range(100):
            if server.open_connections == 0:
                break
            await asyncio.sleep(0.02)
        assert (await get(server.url))[0] == 200


async def test_an_idle_connection_is_closed_after_the_timeout() -> None:
    limits = ServerLimits(idle_timeout_s=0.3)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with MetricsServer(registry(), host="127.0.0.1") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for _ in range(3):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(3) == b"ok\n"
        writer.close()


@pytest.mark.parametrize(
    "request_bytes", [b"\x00\x01garbage\r\n\r\n", b"POST /metrics HTTP/1.1\r\n"]
)
async def test_nonsense_does_not_hurt_the_server(request_bytes: bytes) -> None:
    async with MetricsServer(registry(), host="127.0.0.1") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request_bytes + b"Host: x\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.read(200), 5)
        assert first == b"" or first.startswith(b"HTTP/1.1 405")
        writer.close()
        assert (await get(server.url))[0] == 200
