"""The agent's HTTP endpoint over real sockets: routes, probes, limits, no thread per client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuslice.metrics import MetricsServer
from gpuslice.metrics.server import ServerLimits
from gpuslice.testing.eventually import eventually


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
    limits = ServerLimits(max_connections=300, max_per_address=300, head_timeout_s=30.0)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        threads_before = threading.active_count()
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(300)]
        await eventually(lambda: server.open_connections == 300, "server.open_connections == 300")
        assert server.open_connections == 300
        assert threading.active_count() <= threads_before + 1, "no thread per connection"
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        reply = await asyncio.wait_for(reader.read(), 5)
        assert reply.startswith(b"HTTP/1.1 503")
        writer.close()
        for _, w in idle:
            w.close()
        # the slots come back: a scrape works again
        await eventually(lambda: server.open_connections == 0, "server.open_connections == 0")
        assert (await get(server.url))[0] == 200


async def test_an_unfinished_head_is_closed_after_the_deadline() -> None:
    limits = ServerLimits(head_timeout_s=0.3)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_the_head_deadline_is_not_restarted_by_a_trickle() -> None:
    """A byte every 50 ms would keep a per-read timeout of 0.3 s from ever firing; the
    whole head's deadline closes the connection while the trickle is still going."""
    limits = ServerLimits(head_timeout_s=0.3)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400

        async def trickle() -> None:
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)

        sender = asyncio.ensure_future(trickle())
        try:
            assert await asyncio.wait_for(reader.read(), 15) == b""
            assert not sender.done(), "closed only after the whole trickle was sent"
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            writer.close()


async def test_an_idle_keep_alive_connection_is_closed_after_the_deadline() -> None:
    limits = ServerLimits(head_timeout_s=0.3)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        assert await reader.readexactly(3) == b"ok\n"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # then nothing: closed
        writer.close()


def big_registry(samples: int) -> CollectorRegistry:
    """About 80 bytes a sample: enough to fill both sockets' buffers."""
    reg = CollectorRegistry()
    gauge = Gauge("gpuslice_test_big", "big", ["pad"], registry=reg)
    for i in range(samples):
        gauge.labels(f"{i:060d}").set(i)
    return reg


async def test_a_client_that_never_reads_its_answer_is_dropped() -> None:
    limits = ServerLimits(write_timeout_s=0.5)
    async with MetricsServer(big_registry(150_000), host="127.0.0.1", limits=limits) as server:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # take nothing of the answer
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await eventually(
            lambda: server.open_connections == 0,
            "server.open_connections == 0",
            timeout=15,
        )
        assert server.open_connections == 0, "the connection is dropped by the server"
        transport.resume_reading()
        received = b""
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
                received += chunk
        assert len(received) < 150_000 * 60, "the answer was cut, not delivered"
        writer.close()
        assert (await get(f"{server.base_url}/healthz"))[0] == 200


async def test_one_address_gets_its_share_and_others_still_get_in() -> None:
    limits = ServerLimits(max_per_address=4, head_timeout_s=30.0)
    async with MetricsServer(registry(), host="127.0.0.1", limits=limits) as server:
        held = [
            await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
            for _ in range(4)
        ]
        await eventually(lambda: server.open_connections == 4, "server.open_connections == 4")
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, local_addr=("127.0.0.2", 0)
        )
        refused = await asyncio.wait_for(reader.read(), 5)
        assert refused.startswith(b"HTTP/1.1 503")
        assert refused.endswith(b"too many connections from this address\n")
        writer.close()
        # the kubelet (another address) is not affected
        assert (await get(f"{server.base_url}/healthz"))[0] == 200
        for _, w in held:
            w.close()


async def test_metrics_has_its_own_bound_and_the_probes_answer_meanwhile() -> None:
    release = threading.Event()

    class Slow:
        def collect(self) -> list[object]:
            release.wait(10)
            return []

    reg = registry()
    reg.register(Slow())  # type: ignore[arg-type]
    limits = ServerLimits(max_scrapes=1)
    async with MetricsServer(reg, host="127.0.0.1", limits=limits) as server:
        first = asyncio.ensure_future(get(server.url))
        await eventually(
            lambda: server._scrapes == 1, "server._scrapes == 1", timeout=2, interval=0.01
        )
        code, _, body = await get(server.url)
        assert (code, body) == (503, "too many scrapes at once\n")
        assert (await get(f"{server.base_url}/healthz"))[0] == 200
        release.set()
        assert (await first)[0] == 200


async def test_the_probe_listener_serves_only_the_probes() -> None:
    async with MetricsServer(registry(), host="127.0.0.1", routes="probes") as server:
        base = server.base_url
        assert (await get(f"{base}/healthz"))[0] == 200
        assert (await get(f"{base}/readyz"))[0] == 200
        for path in ("/metrics", "/status", "/"):
            assert (await get(base + path))[0] == 404, path


@pytest.mark.parametrize(
    "limits",
    [
        {"max_connections": 0},
        {"max_per_address": -1},
        {"head_timeout_s": 0},
        {"write_timeout_s": float("inf")},
        {"head_timeout_s": float("nan")},
    ],
)
def test_limits_that_would_disable_the_protection_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(limits))):
        ServerLimits(**limits)  # type: ignore[arg-type]


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
