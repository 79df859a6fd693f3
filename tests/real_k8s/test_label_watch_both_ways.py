"""NodeLabelWatcher (the device-plugin mode's `nvidia.com/device-plugin.config` label) against
the double and a real kube-apiserver alike: changes, removal, the Node deleted and created,
an API server restart, and the `410 Gone` a restarted server answers a watch from an older
resourceVersion with. What only the double can do (fail requests on demand, record what was
asked) stays in tests/k8s/test_label_watch.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from gpuslice.k8s import Backoff, NodeLabelWatcher, make_client
from gpuslice.testing.kubes import Kube

LABEL = "nvidia.com/device-plugin.config"
FAST = Backoff(initial_s=0.01, maximum_s=0.05)


async def next_value(stream: AsyncGenerator[str, None]) -> str:
    async with asyncio.timeout(20):
        return await anext(stream)


async def first_event(client: AsyncClient, node: str, version: str) -> object:
    """The first event of a watch of `node` from `version` (raises what the watch raises)."""
    async with asyncio.timeout(20):
        async for event in client.watch(
            Node, fields={"metadata.name": node}, resource_version=version
        ):
            return event
    raise AssertionError("the watch ended without an event")


@asynccontextmanager
async def client_of(kube: Kube) -> AsyncIterator[AsyncClient]:
    c = make_client(kube.kubeconfig, trust_env=False)
    try:
        yield c
    finally:
        await c.close()


async def test_initial_value_then_changes(kube: Kube, client: AsyncClient) -> None:
    node, other = kube.name("gpu-1"), kube.name("gpu-2")
    kube.add_node(node, {LABEL: "a100"})
    kube.add_node(other, {LABEL: "y"})
    watcher = NodeLabelWatcher(client, node, LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == "a100"
        kube.set_node_label(node, LABEL, "ls40")
        assert await next_value(values) == "ls40"
        # Other labels, and other nodes, changing are not changes of ours: the next value
        # is the next real one.
        kube.set_node_label(node, "team", "ml")
        kube.set_node_label(other, LABEL, "changed")
        kube.set_node_label(node, LABEL, None)
        assert await next_value(values) == ""
        kube.set_node_label(node, LABEL, "a100")
        assert await next_value(values) == "a100"
    assert watcher.reconnects == 0


async def test_node_not_there_yet_then_deleted(kube: Kube, client: AsyncClient) -> None:
    node = kube.name("late")
    watcher = NodeLabelWatcher(client, node, LABEL, backoff=FAST)
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == ""
        pending = asyncio.create_task(next_value(values))
        await asyncio.sleep(0)  # the watch may or may not have begun: either way, seen
        kube.add_node(node, {LABEL: "t4"})
        assert await pending == "t4"
        kube.delete_node(node)
        assert await next_value(values) == ""
        kube.add_node(node, {LABEL: "a10"})
        assert await next_value(values) == "a10"


async def test_feed_pushes_values_into_the_agent_queue(kube: Kube, client: AsyncClient) -> None:
    node = kube.name("gpu-3")
    kube.add_node(node, {LABEL: "a"})
    queue: asyncio.Queue[str] = asyncio.Queue()
    task = asyncio.create_task(NodeLabelWatcher(client, node, LABEL, backoff=FAST).feed(queue))
    try:
        async with asyncio.timeout(20):
            assert await queue.get() == "a"
            kube.set_node_label(node, LABEL, "b")
            assert await queue.get() == "b"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_restart_of_the_api_server_is_ridden_through(restartable_kube: Kube) -> None:
    """The watch open across the restart is cut; the watcher comes back and sees what
    changes after (and what changed while it was away)."""
    kube = restartable_kube
    node = kube.name("gpu-1")
    kube.add_node(node, {LABEL: "a"})
    async with client_of(kube) as client:
        watcher = NodeLabelWatcher(client, node, LABEL, backoff=FAST)
        async with aclosing(watcher.values()) as values:
            assert await next_value(values) == "a"
            kube.set_node_label(node, LABEL, "a2")
            assert await next_value(values) == "a2"  # from the watch: it is open
            pending = asyncio.create_task(next_value(values))
            await asyncio.to_thread(kube.restart)
            kube.set_node_label(node, LABEL, "b")
            assert await pending == "b"
            kube.set_node_label(node, LABEL, None)
            assert await next_value(values) == ""
        assert watcher.reconnects >= 1, "the watch was cut"


async def test_after_a_restart_a_watch_from_an_older_version_is_gone_and_the_watcher_does_not_ask_for_one(  # noqa: E501
    restartable_kube: Kube,
) -> None:
    """A restarted API server's watch cache begins at the store's revision then: a watch
    from the resourceVersion of a Node written before is 410 Gone. The watcher watches from
    its list's version, so a watcher started then (an agent restarted with its API server)
    reads and watches without one failure. Watching from the Node's own version instead
    failed at once and again, a GET and a 410 each backoff step, until the Node changed."""
    kube = restartable_kube
    node = kube.name("gpu-1")
    kube.add_node(node, {LABEL: "a"})
    version = str(kube.node(node)["metadata"]["resourceVersion"])
    kube.add_node(kube.name("gpu-2"))  # a later write: the Node's version is not the newest
    kube.restart()
    async with client_of(kube) as client:
        with pytest.raises(ApiError) as gone:
            await first_event(client, node, version)
        assert gone.value.status.code == 410
        watcher = NodeLabelWatcher(client, node, LABEL, backoff=FAST)
        async with aclosing(watcher.values()) as values:
            assert await next_value(values) == "a"
            pending = asyncio.create_task(next_value(values))
            await asyncio.sleep(0)
            kube.set_node_label(node, LABEL, "b")
            assert await pending == "b"
        assert watcher.reconnects == 0


CORDON = "gpuslice.io/gpu-cordon"


async def test_the_same_watch_reports_the_cordon_annotation(
    kube: Kube, client: AsyncClient
) -> None:
    """The GPU cordon rides on the label's watch: its value at once ("" when unset), each
    change before the label value read from the same Node, removal as "", and other
    annotations are no change of ours."""
    node = kube.name("gpu-cordon")
    kube.add_node(node, {LABEL: "a"})
    seen: list[str] = []
    watcher = NodeLabelWatcher(
        client, node, LABEL, backoff=FAST, annotation_key=CORDON, on_annotation=seen.append
    )
    async with aclosing(watcher.values()) as values:
        assert await next_value(values) == "a"
        assert seen == [""]
        kube.set_node_annotation(node, CORDON, "0,GPU-1")
        kube.set_node_annotation(node, "other.example/x", "1")
        kube.set_node_label(node, LABEL, "b")  # a label change after them: a fence
        assert await next_value(values) == "b"
        assert seen == ["", "0,GPU-1"]
        kube.set_node_annotation(node, CORDON, None)
        kube.set_node_label(node, LABEL, "c")
        assert await next_value(values) == "c"
        assert seen == ["", "0,GPU-1", ""]
