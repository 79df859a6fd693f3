"""NodeLabelWatcher against the API server double, through lightkube over real HTTP."""

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


async def test_initial_value_then_changes(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_node("gpu-1", {LABEL: "a100"})
    watcher = NodeLabelWatcher(client, "gpu-1", LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == "a100"
        api.set_node_label("gpu-1", LABEL, "ls40")
        assert await next_value(values) == "ls40"
        # Other labels changing is not a change of ours; the next value is the next real one.
        api.set_node_label("gpu-1", "team", "ml")
        api.set_node_label("gpu-1", LABEL, None)
        assert await next_value(values) == ""
        api.set_node_label("gpu-1", LABEL, "a100")
        assert await next_value(values) == "a100"
    assert watcher.reconnects == 0


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


async def test_node_not_there_yet(api: FakeApiServer, client: AsyncClient) -> None:
    watcher = NodeLabelWatcher(client, "late", LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == ""
        pending = asyncio.create_task(next_value(values))
        assert await until(api, lambda: api.watches_started >= 1)
        api.add_node("late", {LABEL: "t4"})
        assert await pending == "t4"
        api.delete_node("late")
        assert await next_value(values) == ""


async def test_feed_pushes_values_into_the_agent_queue(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_node("gpu-1", {LABEL: "a"})
    queue: asyncio.Queue[str] = asyncio.Queue()
    watcher = NodeLabelWatcher(client, "gpu-1", LABEL, backoff=FAST)
    task = asyncio.create_task(watcher.feed(queue))
    try:
        async with asyncio.timeout(10):
            assert await queue.get() == "a"
            api.set_node_label("gpu-1", LABEL, "b")
            assert await queue.get() == "b"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_backoff_grows_and_caps() -> None:
    delays = Backoff(initial_s=1, maximum_s=5, factor=2).delays()
    assert [next(delays) for _ in range(5)] == [1, 2, 4, 5, 5]
