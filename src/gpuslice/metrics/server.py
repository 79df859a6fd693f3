"""The agent's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/status`, 404 elsewhere.

The port listens on the pod network, so any pod in the cluster can open connections to it,
and the kubelet's liveness probe restarts the agent (device plugin, memory guard and all) when
`/healthz` stops answering. A client must never be able to use up what the probes need:

- **a fixed deadline for a whole request head** (`head_timeout_s`), counted from the moment the
  server starts waiting for it (connection accepted, or the previous answer sent on a
  keep-alive connection): a head trickled in a byte at a time, or a keep-alive connection left
  idle, is closed when the deadline passes, however often bytes arrive;
- **a write deadline** (`write_timeout_s`): a client that never reads its answer is dropped
  instead of holding the connection (and the rendered `/metrics` bytes) forever;
- **a cap per client address** (`max_per_address`) below the total cap (`max_connections`), so
  a pod (one address) that opens and reopens connections as fast as they are dropped holds at
  most its share, and the kubelet's address always finds room;
- **`/metrics` its own bound** (`max_scrapes`): scrapes being rendered or sent at once, the
  next answered 503, so a scrape storm never stalls the loop the probes run on;
- **a listener of the probes' own** (`gpuslice plugin --health-port`, the chart's `health`
  port): the same server with only `/healthz` and `/readyz` and its own capacity, so the
  scrape port's load, whatever it is, never reaches the probes. The scrape port still answers
  the probe paths too (for `curl` and older charts).

Why not a maintained server instead: prometheus_client's `start_http_server` and the stdlib
WSGI server are a `ThreadingHTTPServer` (a thread per connection, no limits, no timeouts);
uvicorn and hypercorn bound idle keep-alive and concurrency, but neither bounds the time a
request head may take as a whole (uvicorn's `timeout_keep_alive` restarts at each byte, its
`limit_concurrency` counts all clients as one), nor caps connections per client address, and
they would bring an ASGI stack to serve four GET routes. Here every connection lives on the
agent's event loop (asyncio streams), HTTP/1.1 framing is `h11` (a well-kept sans-IO parser,
so no hand-written HTTP parsing), and the exposition is prometheus_client's
(`choose_encoder`/`generate_latest`, content negotiation included). Rendering `/metrics` runs
in a worker thread, and scrapes that arrive while one renders share that rendering (200
concurrent scrapes cost a few renderings, not 200; see bench/bench_endpoint.py). Request heads
are bounded by h11 (16 KiB); bodies are never read (every route is a GET).

`/healthz` is 200 while the loop answers (the probe fails when the loop is stuck);
`/readyz` is 200 once `ready()` says the device plugins are registered with the kubelet;
`/status` is the JSON `status()` returns (what `gpuslice top` shows).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import h11
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuslice.logs import get_logger

log = get_logger("gpuslice.metrics")

Readiness = Callable[[], tuple[bool, str]]
"""() -> (ready, why): why is the body of `/readyz`."""
StatusSource = Callable[[], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_connections: int = 512
    """Open connections at once on one listener; one more is answered 503 and closed."""
    max_per_address: int = 16
    """Open connections at once from one client address (a pod, or the node's kubelet)."""
    head_timeout_s: float = 5.0
    """Seconds for a whole request head, from when the server starts waiting for it (idle
    keep-alive time included); not restarted by the bytes that arrive."""
    write_timeout_s: float = 10.0
    """Seconds a client has to take an answer (and the refusal of a connection over a cap)."""
    max_scrapes: int = 32
    """`/metrics` answers being rendered or sent at once; one more is answered 503."""
    read_chunk: int = 16384

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_per_address", "max_scrapes", "read_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("head_timeout_s", "write_timeout_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, not {value}")


Routes = Literal["all", "probes"]
"""`probes`: only `/healthz` and `/readyz` (the probe listener)."""
_PROBE_PATHS = frozenset({"/healthz", "/readyz"})


def _refusal(why: str) -> bytes:
    body = why.encode() + b"\n"
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


_TOO_MANY = _refusal("too many connections")
_TOO_MANY_FROM_YOU = _refusal("too many connections from this address")


class _Deadline(Exception):
    """A client missed the head or write deadline."""


def _always_ready() -> tuple[bool, str]:
    return True, "ready\n"


class MetricsServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        ready: Readiness = _always_ready,
        status: StatusSource | None = None,
        limits: ServerLimits | None = None,
        routes: Routes = "all",
    ) -> None:
        self.registry = registry
        self.host = host
        """Address to bind; an IPv6 literal (`::`) binds IPv6."""
        self.requested_port = port
        self.ready = ready
        self.status = status
        self.limits = limits or ServerLimits()
        self.routes = routes
        self._server: asyncio.Server | None = None
        self._open = 0
        self._per_address: dict[str, int] = {}
        self._scrapes = 0
        self._connections: set[asyncio.Task[Any]] = set()
        self._rendering: dict[str, asyncio.Future[bytes]] = {}

    @property
    def port(self) -> int:
        """The bound port; only valid after `start`."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("metrics server is not running")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def open_connections(self) -> int:
        return self._open

    async def start(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._serve_connection, self.host or None, self.requested_port, backlog=1024
        )

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- connections -----------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self._open += 1
        from_address = self._per_address.get(address, 0) + 1
        self._per_address[address] = from_address
        flush = True
        try:
            if self._open > self.limits.max_connections:
                # h11 answers only after a request; these fixed replies need none
                log.debug("http-refused", reason="connection-limit", open=self._open)
                await self._write(writer, _TOO_MANY)
                return
            if from_address > self.limits.max_per_address:
                log.debug("http-refused", reason="address-limit", address=address)
                await self._write(writer, _TOO_MANY_FROM_YOU)
                return
            await self._requests(reader, writer)
        except _Deadline:
            flush = False  # too slow: what it did not take is dropped with the connection
        except (ConnectionError, TimeoutError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass  # a client that went away or spoke nonsense: nothing to answer
        finally:
            self._open -= 1
            left = self._per_address.get(address, 1) - 1
            if left > 0:
                self._per_address[address] = left
            else:
                self._per_address.pop(address, None)
            if task is not None:
                self._connections.discard(task)
            await self._close(writer, flush)

    async def _close(self, writer: asyncio.StreamWriter, flush: bool) -> None:
        """Close after the answer is flushed, within the write deadline; a client that reads
        nothing does not hold the connection (or its buffered answer) past it."""
        if flush:
            writer.close()
            try:
                async with asyncio.timeout(self.limits.write_timeout_s):
                    await writer.wait_closed()
                return
            except (TimeoutError, ConnectionError, OSError):
                pass
        writer.transport.abort()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        try:
            async with asyncio.timeout(self.limits.write_timeout_s):
                await writer.drain()
        except TimeoutError:
            raise _Deadline("the client did not take its answer in time") from None

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request = await self._next_request(reader, conn)
            if request is None:
                return
            await self._respond(writer, conn, request)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            # every route is a GET: a request that comes with a body ends the connection
            if not isinstance(conn.next_event(), h11.EndOfMessage):
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _next_request(
        self, reader: asyncio.StreamReader, conn: h11.Connection
    ) -> h11.Request | None:
        """The next request head, which must arrive whole within `head_timeout_s` of now."""
        try:
            async with asyncio.timeout(self.limits.head_timeout_s):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(self.limits.read_chunk))
                        continue
                    if isinstance(event, h11.Request):
                        return event
                    return None  # ConnectionClosed, PAUSED
        except TimeoutError:
            raise _Deadline("no whole request head in time") from None

    async def _render(self, accept: str) -> tuple[bytes, str]:
        """Scrapes arriving while one rendering of the same format runs share its result:
        rendering is most of a scrape's cost, and N concurrent scrapes otherwise cost N
        renderings (each a consistent view of the registry a few ms old at most)."""
        encoder, content_type = choose_encoder(accept)
        pending = self._rendering.get(content_type)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(encoder, self.registry))
            self._rendering[content_type] = pending
            pending.add_done_callback(lambda _f: self._rendering.pop(content_type, None))
        return await asyncio.shield(pending), content_type

    async def _respond(
        self, writer: asyncio.StreamWriter, conn: h11.Connection, request: h11.Request
    ) -> None:
        path = request.target.decode("latin-1").split("?", 1)[0]
        head_only = request.method == b"HEAD"
        if request.method not in (b"GET", b"HEAD"):
            await self._send(writer, conn, 405, b"method not allowed\n", "text/plain")
            return
        if self.routes == "probes" and path not in _PROBE_PATHS:
            await self._send(writer, conn, 404, b"not found\n", "text/plain", head_only)
        elif path == "/metrics":
            await self._scrape(writer, conn, request, head_only)
        elif path == "/healthz":
            await self._send(writer, conn, 200, b"ok\n", "text/plain", head_only)
        elif path == "/readyz":
            ok, why = self.ready()
            await self._send(writer, conn, 200 if ok else 503, why.encode(), "text/plain")
        elif path == "/status" and self.status is not None:
            body = json.dumps(self.status(), indent=1, sort_keys=True).encode() + b"\n"
            await self._send(writer, conn, 200, body, "application/json", head_only)
        else:
            await self._send(writer, conn, 404, b"not found\n", "text/plain", head_only)

    async def _scrape(
        self,
        writer: asyncio.StreamWriter,
        conn: h11.Connection,
        request: h11.Request,
        head_only: bool,
    ) -> None:
        if self._scrapes >= self.limits.max_scrapes:
            log.debug("http-refused", reason="scrape-limit", scrapes=self._scrapes)
            await self._send(writer, conn, 503, b"too many scrapes at once\n", "text/plain")
            return
        self._scrapes += 1
        try:
            accept = dict(request.headers).get(b"accept", b"").decode("latin-1")
            body, content_type = await self._render(accept)
            await self._send(writer, conn, 200, body, content_type, head_only)
        finally:
            self._scrapes -= 1

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        conn: h11.Connection,
        code: int,
        body: bytes,
        content_type: str,
        head_only: bool = False,
    ) -> None:
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        data = conn.send(h11.Response(status_code=code, headers=headers)) or b""
        if not head_only:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await self._write(writer, data)


__all__ = ["MetricsServer", "Readiness", "Routes", "ServerLimits", "StatusSource"]
