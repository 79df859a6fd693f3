"""The agent's HTTP endpoint: `/metrics`, `/healthz`, `/readyz`, `/status`, 404 elsewhere.

Why not prometheus_client's own `start_http_server` (or `make_wsgi_app` on the stdlib WSGI
server, which this module used before): both are a `ThreadingHTTPServer`, one thread per
connection with no limit and no idle timeout, so 300 idle connections hold 300 threads and a
slow client holds one forever, in a daemon that must stay small. Here every connection lives
on the agent's event loop (asyncio streams), HTTP/1.1 framing is `h11` (a well-kept sans-IO
parser, so no hand-written HTTP parsing), and the exposition itself is still
prometheus_client's (`choose_encoder`/`generate_latest`, content negotiation included):

- at most `max_connections` open at once; one more is answered 503 and closed at once;
- a connection idle for `idle_timeout_s` (no request, or a request trickling in) is closed;
- a request head is bounded by h11 (16 KiB), bodies are not read (every route is a GET);
- rendering `/metrics` runs in a worker thread, so `/healthz` keeps answering during a big
  scrape, and scrapes that arrive while one renders share that rendering (200 concurrent
  scrapes cost a few renderings, not 200; see bench/bench_endpoint.py).

`/healthz` is 200 while the loop answers (the probe fails when the loop is stuck);
`/readyz` is 200 once `ready()` says the device plugins are registered with the kubelet;
`/status` is the JSON `status()` returns (what `gpuslice top` shows).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

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
    max_connections: int = 64
    """Open connections at once; Prometheus, the kubelet's probes and `top` need a handful."""
    idle_timeout_s: float = 15.0
    """Seconds a connection may sit without completing a request before it is closed."""
    read_chunk: int = 16384


_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
)


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
    ) -> None:
        self.registry = registry
        self.host = host
        """Address to bind; an IPv6 literal (`::`) binds IPv6."""
        self.requested_port = port
        self.ready = ready
        self.status = status
        self.limits = limits or ServerLimits()
        self._server: asyncio.Server | None = None
        self._open = 0
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
            self._serve_connection, self.host or None, self.requested_port, backlog=256
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
        self._open += 1
        try:
            if self._open > self.limits.max_connections:
                # h11 answers only after a request; this fixed reply needs none
                log.debug("http-refused", reason="connection-limit", open=self._open)
                writer.write(_TOO_MANY)
                await writer.drain()
                return
            await self._requests(reader, writer)
        except (ConnectionError, TimeoutError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass  # a client that went away or spoke nonsense: nothing to answer
        finally:
            self._open -= 1
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request = await self._next_request(reader, conn)
            if request is None:
                return
            await self._respond(writer, conn, request)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            # drain the (ignored) body up to EndOfMessage, then go round for keep-alive
            event: object = request
            while not isinstance(event, h11.EndOfMessage):
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await asyncio.wait_for(
                        reader.read(self.limits.read_chunk), self.limits.idle_timeout_s
                    )
                    conn.receive_data(data)
                elif isinstance(event, h11.ConnectionClosed):
                    return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _next_request(
        self, reader: asyncio.StreamReader, conn: h11.Connection
    ) -> h11.Request | None:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(
                    reader.read(self.limits.read_chunk), self.limits.idle_timeout_s
                )
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                return event
            return None  # ConnectionClosed, PAUSED

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
        if path == "/metrics":
            accept = dict(request.headers).get(b"accept", b"").decode("latin-1")
            body, content_type = await self._render(accept)
            await self._send(writer, conn, 200, body, content_type, head_only)
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
        writer.write(conn.send(h11.Response(status_code=code, headers=headers)))
        if not head_only:
            writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


__all__ = ["MetricsServer", "Readiness", "ServerLimits", "StatusSource"]
