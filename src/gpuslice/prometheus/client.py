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

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.core.advise import AdviseError, RawSeries

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


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def chunks(window: Window) -> list[tuple[float, float]]:
    """(start, end) of each `query_range` call: consecutive, at most MAX_POINTS points,
    on one grid."""
    out = []
    at = window.start
    span = (MAX_POINTS - 1) * window.step_s
    while at <= window.end:
        stop = min(window.end, at + span)
        out.append((at, stop))
        at = stop + window.step_s
    return out


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    """The metric the answer's series are (the functions drop `__name__`)."""
    path: str
    params: Mapping[str, str]


def requests_for(window: Window) -> list[Request]:
    """Every request `series` makes for a window, in order: a range query per metric and
    time chunk, then the instant queries."""
    out = []
    # A millisecond short of the step: Prometheus 2's range selectors include both ends,
    # and a sample exactly one step back belongs to the previous point.
    step = _duration(window.step_s - 0.001)
    for name, query in RANGE_QUERIES.items():
        for start, end in chunks(window):
            params = {
                "query": query.format(step=step),
                "start": f"{start:.3f}",
                "end": f"{end:.3f}",
                "step": f"{window.step_s:g}",
            }
            out.append(Request(name, "/api/v1/query_range", params))
    rng = _duration(window.seconds)
    for name, query in INSTANT_QUERIES.items():
        params = {"query": query.format(range=rng), "time": f"{window.end:.3f}"}
        out.append(Request(name, "/api/v1/query", params))
    return out


class PrometheusReader:
    def __init__(self, url: str, *, timeout_s: float = 60.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise AdviseError(f"--prometheus: expected an http:// or https:// URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.requests = 0
        """How many HTTP requests this reader made (the bench and tests count them)."""

    def series(self, window: Window) -> list[RawSeries]:
        """Every series `advise` reads, over the window."""
        merged: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
        for request in requests_for(window):
            for r in self._get(request.path, request.params):
                labels = tuple(sorted(dict(r.get("metric", {})).items()))
                points = merged.setdefault((request.name, labels), [])
                if "values" in r:
                    # JSON gives the times as numbers already, the values as strings
                    points.extend([(t, float(v)) for t, v in r["values"]])
                elif "value" in r:
                    points.append((float(r["value"][0]), float(r["value"][1])))
        return [RawSeries(name, dict(labels), pts) for (name, labels), pts in merged.items()]

    def url_of(self, request: Request) -> str:
        return f"{self.url}{request.path}?{urllib.parse.urlencode(request.params)}"

    def _get(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        """The `result` list of a successful answer (JSON, hence Any)."""
        where = f"Prometheus at {self.url}"
        url = self.url_of(Request("", path, params))
        self.requests += 1
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:  # 4xx/5xx: Prometheus explains in its JSON
            status, raw = exc.code, exc.read()
        except (OSError, ValueError) as exc:
            raise AdviseError(f"cannot reach {where}: {exc}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            raise AdviseError(
                f"{where} answered {status} with something that is not Prometheus's API "
                f"JSON: {raw[:200]!r}"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error", body) if isinstance(body, dict) else body
            raise AdviseError(f"{where} refused {params.get('query', '')!r} ({status}): {detail}")
        data = body.get("data", {})
        result = data.get("result", []) if isinstance(data, dict) else []
        return result if isinstance(result, list) else []
