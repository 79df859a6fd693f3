"""The exporter's history from Prometheus's HTTP API: a handful of requests per run.

Per-pod memory and SM use come from `query_range` at the scrape interval, one query per
metric for every pod at once (a request per pod would not scale to a fleet), cut into
time chunks of at most `MAX_POINTS` points because Prometheus refuses a range of more
than 11,000 points per series. Each point is `max_over_time(...[step])`: the largest
sample in the step before it (a millisecond short, so one scrape counts once), so a pod's
series ends at its last scrape instead of lingering for Prometheus's 5-minute lookback,
and a peak between two steps is kept. The
GPUs' model and memory (`DCGM_FI_DEV_FB_*`, `modelName`) and the replicas the pods held
(`gpuslice_pod_entitled_sm_fraction`) are one instant query each.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gpuslice.core.advise import POD_MEMORY, AdviseError, RawSeries
from gpuslice.core.advise.history import MAX_GRID_POINTS
from gpuslice.core.units import MIB

MAX_POINTS = 11_000
"""Prometheus's limit on points per series in one `query_range` answer."""


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    step_s: float

    @property
    def seconds(self) -> int:
        return max(1, math.ceil(self.end - self.start))

    @property
    def points(self) -> int:
        return math.floor((self.end - self.start) / self.step_s) + 1


RANGE_QUERIES = {
    "gpuslice_pod_memory_used_bytes": "max_over_time(gpuslice_pod_memory_used_bytes[{step}])",
    "gpuslice_pod_sm_util_percent": "max_over_time(gpuslice_pod_sm_util_percent[{step}])",
}
INSTANT_QUERIES = {
    "gpuslice_pod_entitled_sm_fraction": (
        "max_over_time(gpuslice_pod_entitled_sm_fraction[{range}])"
    ),
    "DCGM_FI_DEV_FB_USED": "last_over_time(DCGM_FI_DEV_FB_USED[{range}])",
    "DCGM_FI_DEV_FB_FREE": "last_over_time(DCGM_FI_DEV_FB_FREE[{range}])",
}


PROBE_QUERY = f"count(last_over_time({POD_MEMORY}[{{range}}]))"
"""Asked first: whether (and how many) pod memory series the window holds at all."""


def request_count(window: Window) -> int:
    """How many requests `iter_requests` makes, counted without listing them."""
    span = (MAX_POINTS - 1) * window.step_s
    per_metric = max(1, math.floor((window.end - window.start) / (span + window.step_s)) + 1)
    return len(RANGE_QUERIES) * per_metric + len(INSTANT_QUERIES)


def _silent(_line: str) -> None:
    return


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def chunks(window: Window) -> list[tuple[float, float]]:
    """(start, end) of each `query_range` call: consecutive, at most MAX_POINTS points,
    on one grid."""
    return list(iter_chunks(window))


def iter_chunks(window: Window) -> Iterator[tuple[float, float]]:
    """`chunks`, one at a time: a window of billions of steps is refused after its first
    request (`PrometheusReader.series`), never listed whole."""
    at = window.start
    span = (MAX_POINTS - 1) * window.step_s
    while at <= window.end:
        stop = min(window.end, at + span)
        yield at, stop
        at = stop + window.step_s


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    """The metric the answer's series are (the functions drop `__name__`)."""
    path: str
    params: Mapping[str, str]


def requests_for(window: Window) -> list[Request]:
    """Every request `series` makes for a window, in order: a range query per metric and
    time chunk, then the instant queries."""
    return list(iter_requests(window))


def iter_requests(window: Window) -> Iterator[Request]:
    """`requests_for`, one at a time."""
    # A millisecond short of the step: Prometheus 2's range selectors include both ends,
    # and a sample exactly one step back belongs to the previous point.
    step = _duration(window.step_s - 0.001)
    for name, query in RANGE_QUERIES.items():
        for start, end in iter_chunks(window):
            params = {
                "query": query.format(step=step),
                "start": f"{start:.3f}",
                "end": f"{end:.3f}",
                "step": f"{window.step_s:g}",
            }
            yield Request(name, "/api/v1/query_range", params)
    rng = _duration(window.seconds)
    for name, query in INSTANT_QUERIES.items():
        params = {"query": query.format(range=rng), "time": f"{window.end:.3f}"}
        yield Request(name, "/api/v1/query", params)


class PrometheusReader:
    def __init__(self, url: str, *, timeout_s: float = 60.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise AdviseError(f"--prometheus: expected an http:// or https:// URL, got {url!r}")
        self.url = url.rstrip("/")
        try:
            self.origin = _origin(self.url)
        except ValueError as exc:
            raise AdviseError(f"--prometheus: {exc}, got {url!r}") from None
        self.timeout_s = timeout_s
        self.requests = 0
        """How many HTTP requests this reader made (the bench and tests count them)."""
        self.samples = 0

    def series(
        self, window: Window, progress: Callable[[str], None] | None = None
    ) -> list[RawSeries]:
        """Every series `advise` reads, over the window. `progress` hears what is being
        read, a line per request; the first request asks whether any pod's memory is in
        the window at all, and nothing more is asked when none is."""
        say = progress or _silent
        say(f"asking Prometheus at {self.url} for pods' GPU memory in the range")
        found = self.pods_in(window)
        if found == 0:
            raise AdviseError(
                f"no {POD_MEMORY} series in the range {_when(window.start)} to "
                f"{_when(window.end)} at Prometheus {self.url}: is gpuslice's exporter "
                "scraped (`gpuslice plugin --metrics-port`, the chart's "
                "metrics.serviceMonitor.enabled), and is the range right (--since, --until)?"
            )
        total = request_count(window)
        say(f"{found} pod series; reading them in {total} requests")
        merged: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
        for n, request in enumerate(iter_requests(window)):
            say(f"request {n + 1}/{total}: {request.name}")
            if n == 1 and window.points > MAX_GRID_POINTS:
                # After the first request, not before: Prometheus's own refusal (a step
                # under its millisecond resolution) says more than a count of steps.
                raise AdviseError(
                    f"--since/--step: {window.points:,} steps of {window.step_s:g} s, more "
                    f"than the {MAX_GRID_POINTS:,} advise lines up: narrow --since or raise "
                    "--step"
                )
            query = request.params.get("query", "")
            for r in self._get(request.path, request.params):
                labels, points = self._series_of(r, query)
                into = merged.get((request.name, labels))
                if into is None:
                    if len(merged) >= MAX_SERIES:
                        raise AdviseError(
                            f"Prometheus at {self.url}: more than {MAX_SERIES:,} series "
                            "(the most advise reads): narrow the range or the series scraped"
                        )
                    into = merged[(request.name, labels)] = []
                into.extend(points)
        return [RawSeries(name, dict(labels), pts) for (name, labels), pts in merged.items()]

    def pods_in(self, window: Window) -> int:
        """How many pod memory series the window holds (one instant query over it)."""
        query = PROBE_QUERY.format(range=_duration(window.seconds))
        result = self._get("/api/v1/query", {"query": query, "time": f"{window.end:.3f}"})
        count = 0
        for r in result:
            # Prometheus answers one [time, "count"]; anything else there still means
            # series exist, and the range queries check their shape
            value = r.get("value") if isinstance(r, dict) else None
            try:
                count += max(1, int(float(value[1]))) if isinstance(value, list) else 1
            except (TypeError, ValueError, OverflowError, IndexError):
                count += 1
        return count

    def _series_of(
        self, r: object, query: str
    ) -> tuple[tuple[tuple[str, str], ...], list[tuple[float, float]]]:
        """One series of an answer, its types checked: JSON from anyone who can answer on
        that port is not trusted to be a matrix or a vector of [time, "value"]."""
        where = f"Prometheus at {self.url} answered {query!r} with"
        metric = r.get("metric") if isinstance(r, dict) else None
        if not isinstance(metric, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metric.items()
        ):
            raise AdviseError(f"{where} a series without string labels: {_short(r)}")
        assert isinstance(r, dict)
        raw = r["values"] if "values" in r else [r["value"]] if "value" in r else None
        if not isinstance(raw, list):
            raise AdviseError(f"{where} a series without values: {_short(r)}")
        try:
            # JSON gives the times as numbers already, the values as strings ("NaN" and
            # "+Inf" included: the core ignores those and says so)
            if not all(type(p) is list for p in raw):
                raise TypeError
            points = [(float(t), float(v)) for t, v in raw]
        except (TypeError, ValueError, OverflowError):
            bad = next((p for p in raw if not _is_point(p)), raw)
            raise AdviseError(
                f'{where} {_short(bad)} in {_short(metric)}: expected [time, "value"]'
            ) from None
        self.samples += len(points)
        if self.samples > MAX_SAMPLES:
            raise AdviseError(
                f"Prometheus at {self.url}: more than {MAX_SAMPLES:,} samples (the most "
                "advise reads): narrow --since or raise --step"
            )
        return tuple(sorted(metric.items())), points

    def url_of(self, request: Request) -> str:
        return f"{self.url}{request.path}?{urllib.parse.urlencode(request.params)}"

    def _get(self, path: str, params: Mapping[str, str]) -> list[object]:
        """The `result` list of a successful answer (JSON: checked by the caller)."""
        where = f"Prometheus at {self.url}"
        status, raw = self._fetch(self.url_of(Request("", path, params)))
        try:
            body = _decode(raw, MAX_SAMPLES - self.samples)
        except _TooLarge as exc:
            raise AdviseError(f"{where}: {exc}: narrow --since or raise --step") from None
        except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested past the stack
            raise AdviseError(
                f"{where} answered {status} with something that is not Prometheus's API "
                f"JSON: {bytes(raw[:200])!r}"
            ) from None
        del raw
        if not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error", body) if isinstance(body, dict) else body
            raise AdviseError(
                f"{where} refused {params.get('query', '')!r} ({status}): {_short(detail)}"
            )
        data = body.get("data", {})
        result = data.get("result", []) if isinstance(data, dict) else []
        return result if isinstance(result, list) else []

    def _fetch(self, url: str) -> tuple[int, bytearray]:
        """Status and body of a GET, redirects followed within the origin, all of it
        within `timeout_s`: a per-read timeout alone lets a server that sends a byte now
        and then hold advise forever."""
        deadline = time.monotonic() + self.timeout_s
        for _ in range(MAX_REDIRECTS + 1):
            self.requests += 1
            status, location, raw = self._fetch_once(url, deadline)
            if location is None:
                return status, raw
            target = urllib.parse.urljoin(url, location)
            try:
                same = _origin(target) == self.origin
            except ValueError:
                same = False
            if not same:
                raise AdviseError(
                    f"Prometheus at {self.url} redirected ({status}) to {target!r}: only "
                    f"redirects within {self.origin} are followed"
                )
            url = target
        raise AdviseError(f"Prometheus at {self.url}: more than {MAX_REDIRECTS} redirects")

    def _fetch_once(self, url: str, deadline: float) -> tuple[int, str | None, bytearray]:
        where = f"Prometheus at {self.url}"
        late = AdviseError(
            f"{where} sent no whole answer within --timeout {self.timeout_s:g} s "
            "(the whole request, not each read)"
        )
        parts = urllib.parse.urlsplit(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise late
        conn, target, headers = _connection(parts, left)
        expired = threading.Event()
        connected: list[socket.socket] = []

        def expire() -> None:
            # Wakes a read blocked in the socket: it returns, and `expired` says why. The
            # socket is the one kept at connect: http.client lets go of its own reference
            # once an answer without a length is under way.
            expired.set()
            for sock in connected:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(left, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            connected.append(conn.sock)
            if expired.is_set():
                raise late
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
            if response.status in REDIRECTS and response.getheader("Location"):
                return response.status, response.getheader("Location"), bytearray()
            length = response.getheader("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > MAX_BODY_BYTES:
                raise _too_large(where)
            body = bytearray()
            while chunk := response.read(READ_BYTES):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise _too_large(where)
            if expired.is_set():
                raise late
            return response.status, None, body
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if expired.is_set() or time.monotonic() >= deadline:
                raise late from None
            raise AdviseError(f"cannot reach {where}: {exc}") from None
        finally:
            watchdog.cancel()
            conn.close()


MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest answer read (64 MiB): a chunk of 11,000 steps for some 200 pods alive all
along. Read in pieces and stopped past it, before any of it is parsed."""
MAX_SERIES = 100_000
"""The most series read in a run, all metrics together (the bench's fleet: about 2,000)."""
MAX_SAMPLES = 10_000_000
"""The most samples read in a run, all metrics together (the bench's fleet week: 5.8
million). Held as Python floats, about 1.1 GB at the cap."""
MAX_ANSWER_SAMPLES = 3_000_000
"""The most samples in one answer: about what 64 MiB of Prometheus's own `[1764000000.123,
"12345678"]` holds, so that an answer of tighter JSON cannot parse into more objects."""
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
READ_BYTES = 1024 * 1024


class _TooLarge(Exception):
    """An answer holding more series or samples than advise reads."""


def _too_large(where: str) -> AdviseError:
    return AdviseError(
        f"{where} sent an answer over {MAX_BODY_BYTES // MIB} MiB "
        f"({MAX_BODY_BYTES} bytes, the most advise reads): narrow --since or raise --step"
    )


def _decode(raw: bytearray, samples_left: int) -> object:
    """`json.loads`, refusing an answer that would make more objects than the caps before
    parsing it: a 64 MiB answer of tiny series or points is gigabytes once parsed. Every
    point is an array and every series two objects (itself and its labels), so counting
    `[` and `{` bounds them (a bracket inside a label value only makes the count larger)."""
    if raw.count(b"{") > 2 * MAX_SERIES + 8:
        raise _TooLarge(f"an answer of more than {MAX_SERIES:,} series (the most advise reads)")
    arrays = raw.count(b"[")
    if arrays > min(samples_left, MAX_ANSWER_SAMPLES) + MAX_SERIES + 8:
        limit = min(MAX_SAMPLES, MAX_ANSWER_SAMPLES)
        raise _TooLarge(f"an answer of more than {limit:,} samples (the most advise reads)")
    return json.loads(raw)


def _connection(
    parts: urllib.parse.SplitResult, timeout_s: float
) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """The connection, request target and headers for a URL, through the proxy the
    environment names (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`, as urllib reads them):
    a plain http proxy is asked for the whole URL, an https URL is tunnelled."""
    host, port = parts.hostname or "", parts.port
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    headers = {"Accept": "application/json"}
    https = parts.scheme == "https"
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    proxy_url = urllib.request.getproxies().get(parts.scheme)
    if not proxy_url or urllib.request.proxy_bypass(host):
        return kind(host, port, timeout=timeout_s), target, headers
    proxy = urllib.parse.urlsplit(proxy_url if "://" in proxy_url else f"http://{proxy_url}")
    proxy_headers = {}
    if proxy.username is not None:
        userpass = f"{urllib.parse.unquote(proxy.username)}:"
        userpass += urllib.parse.unquote(proxy.password or "")
        proxy_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(
            userpass.encode()
        ).decode("ascii")
    conn = kind(proxy.hostname or "", proxy.port or 80, timeout=timeout_s)
    if https:
        conn.set_tunnel(host, port, headers=proxy_headers)
        return conn, target, headers
    return conn, urllib.parse.urlunsplit(parts), {**headers, **proxy_headers}


def _origin(url: str) -> tuple[str, str, int]:
    """Scheme, host and port: a redirect is followed only to the same three."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"not http or https: {scheme!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


def _is_point(p: object) -> bool:
    if not isinstance(p, list | tuple) or len(p) != 2:
        return False
    try:
        float(p[0])
        float(p[1])
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
