"""Serving a registry over HTTP: prometheus_client's WSGI app on the stdlib WSGI server.

The server runs in a daemon thread; this wrapper gives it an async start/stop so the agent
can supervise it, and reports the bound port (tests use 0). The server loop polls for
shutdown every 50 ms (the stdlib default is 500 ms) so stopping is prompt.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

SHUTDOWN_POLL_S = 0.05


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    def __init__(
        self, registry: CollectorRegistry, *, host: str = "0.0.0.0", port: int = 0
    ) -> None:
        self.registry = registry
        self.host = host
        """Address to bind; an IPv6 literal (`::`) binds IPv6."""
        self.requested_port = port
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port; only valid after `start`."""
        if self._httpd is None:
            raise RuntimeError("metrics server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}/metrics"

    async def start(self) -> None:
        if self._httpd is not None:
            return
        server_class = _Server6 if ":" in self.host else _Server
        httpd = make_server(
            self.host,
            self.requested_port,
            make_wsgi_app(self.registry),
            server_class,
            handler_class=_QuietHandler,
        )
        thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name="gpuslice-metrics-http",
            daemon=True,
        )
        thread.start()
        self._httpd, self._thread = httpd, thread

    async def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        self._httpd, self._thread = None, None
        if httpd is None:
            return
        await asyncio.to_thread(httpd.shutdown)
        httpd.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)

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
