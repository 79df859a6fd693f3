"""NodeLabelWatcher against the API server double, through lightkube over real HTTP: what only
the double can do (cut a stream mid-chunk, fail requests on demand, record the requests).
The rest runs against the double and a real kube-apiserver alike, in
tests/real_k8s/test_label_watch_both_ways.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from lightkube import AsyncClient

from gpuslice.k8s import Backoff, NodeLabelWatcher
from gpuslice.testing.apiserver import FakeApiServer

LABEL = "nvidia.com/device-plugin.config"
FAST = Backoff(initial_s=0.01, maximum_s=0.05)


async def next_value(stream: AsyncGenerator[str, None]) -> str:
    async with asyncio.timeout(10):
        return await anext(stream)


async def until(api: FakeApiServer, predicate: Callable[[], bool]) -> bool:
    """Wait (off the loop, so the client keeps running) for the server to see something."""
    return await asyncio.to_thread(api.wait_for, predicate, 10.0)


async def test_watches_only_its_own_node(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_node("gpu-1", {LABEL: "x"})
    api.add_node("gpu-2", {LABEL: "y"})
    watcher = NodeLabelWatcher(client, "gpu-1", LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == "x"
        api.set_node_label("gpu-2", LABEL, "changed")
        api.set_node_label("gpu-1", LABEL, "mine")
        assert await next_value(values) == "mine"
    watches = [r for r in api.requests if r.query.get("watch") == "true"]
    assert watches
    assert all(r.query["fieldSelector"] == "metadata.name=gpu-1" for r in watches)


async def test_reconnects_after_the_stream_is_cut(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_node("gpu-1", {LABEL: "a"})
    watcher = NodeLabelWatcher(client, "gpu-1", LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == "a"
        pending = asyncio.create_task(next_value(values))
        assert await until(api, lambda: api.watches_started >= 1)
        api.break_watches()
        api.set_node_label("gpu-1", LABEL, "b")  # may land while disconnected
        assert await pending == "b"
        pending = asyncio.create_task(next_value(values))
        assert await until(api, lambda: api.watches_started >= 2)
        api.set_node_label("gpu-1", LABEL, "c")
        assert await pending == "c"
    assert watcher.reconnects >= 1


async def test_retries_through_api_errors(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_node("gpu-1", {LABEL: "a"})
    api.fail_next_requests(3)
    watcher = NodeLabelWatcher(client, "gpu-1", LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == "a"
    assert watcher.reconnects == 3


def test_backoff_grows_and_caps() -> None:
    delays = Backoff(initial_s=1, maximum_s=5, factor=2).delays()
    assert [next(delays) for _ in range(5)] == [1, 2, 4, 5, 5]
