"""NodePods against the API server double, through lightkube over real HTTP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.models.core_v1 import ContainerStatus, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from gpuslice.core.cgroups import ContainerId, PodUid
from gpuslice.k8s import Backoff, NodePods
from gpuslice.k8s.pods import container_id, pod_entry
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.kubes import pods_until, running_pods

FAST = Backoff(initial_s=0.01, maximum_s=0.05)
NODE = "gpu-1"
UID_A = "6f1c2b4e-8d3a-4e57-9b0c-1a2b3c4d5e6f"
UID_B = "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"
UID_C = "d41d8cd98f00b204e9800998ecf8427e"  # a static pod: hash UID, no dashes
ID_1 = "1" * 64
ID_2 = "2" * 64
ID_3 = "3" * 64


async def until(pods: NodePods, predicate: Callable[[], bool]) -> None:
    await pods_until(pods, predicate, 10)


async def server_sees(api: FakeApiServer, predicate: Callable[[], bool]) -> None:
    """Wait (off the loop, so the client keeps running) for the server to see something."""
    assert await asyncio.to_thread(api.wait_for, predicate, 10.0)


async def test_nothing_before_the_first_list_then_the_nodes_pods(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_pod("ml", "trainer", UID_A, NODE, {"main": f"containerd://{ID_1}"})
    api.add_pod("kube-system", "static", UID_C, NODE, {"sidecar": f"containerd://{ID_2}"})
    pods = NodePods(client, NODE, backoff=FAST)
    # "Not known yet" must not read as "no pods on this node".
    assert pods.uid_map() is None
    assert pods.container_names() is None
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        assert pods.uid_map() == {
            PodUid(UID_A): ("ml", "trainer"),
            PodUid(UID_C): ("kube-system", "static"),
        }
        assert pods.container_names() == {ContainerId(ID_1): "main", ContainerId(ID_2): "sidecar"}
    lists = [r for r in api.requests if r.path == "/api/v1/pods" and "watch" not in r.query]
    assert [r.query["fieldSelector"] for r in lists] == [f"spec.nodeName={NODE}"]


async def test_an_empty_node_is_an_empty_map_not_none(
    api: FakeApiServer, client: AsyncClient
) -> None:
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        assert pods.uid_map() == {}
        assert pods.container_names() == {}


async def test_pods_added_restarted_and_deleted_arrive_by_watch(
    api: FakeApiServer, client: AsyncClient
) -> None:
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        api.add_pod("ml", "a", UID_A, NODE, {"main": ""})  # scheduled, not started yet
        await until(pods, lambda: pods.uid_map() == {PodUid(UID_A): ("ml", "a")})
        assert pods.container_names() == {}
        api.set_pod_containers("ml", "a", {"main": f"containerd://{ID_1}"})
        await until(pods, lambda: pods.container_names() == {ContainerId(ID_1): "main"})
        # A container restart gets a new ID; the old one must not stay attributed.
        api.set_pod_containers("ml", "a", {"main": f"containerd://{ID_2}"})
        await until(pods, lambda: pods.container_names() == {ContainerId(ID_2): "main"})
        api.add_pod("ml", "b", UID_B, NODE, {"worker": f"containerd://{ID_3}"})
        await until(pods, lambda: PodUid(UID_B) in (pods.uid_map() or {}))
        api.delete_pod("ml", "a")
        await until(pods, lambda: pods.uid_map() == {PodUid(UID_B): ("ml", "b")})
        assert pods.container_names() == {ContainerId(ID_3): "worker"}
    assert pods.lists == 1
    assert pods.reconnects == 0


async def test_a_pod_recreated_under_the_same_name_is_a_new_uid(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_pod("ml", "job", UID_A, NODE, {"main": ID_1})
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        api.delete_pod("ml", "job")
        api.add_pod("ml", "job", UID_B, NODE, {"main": ID_2})
        await until(pods, lambda: pods.uid_map() == {PodUid(UID_B): ("ml", "job")})
        assert pods.container_names() == {ContainerId(ID_2): "main"}


async def test_container_ids_of_every_runtime_lose_their_scheme(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_pod(
        "ml",
        "multi",
        UID_A,
        NODE,
        {
            "containerd": f"containerd://{ID_1}",
            "crio": f"cri-o://{ID_2}",
            "docker": f"docker://{ID_3}",
            "waiting": "",
        },
    )
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        assert pods.container_names() == {
            ContainerId(ID_1): "containerd",
            ContainerId(ID_2): "crio",
            ContainerId(ID_3): "docker",
        }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"containerd://{ID_1}", ID_1),
        (f"cri-o://{ID_2}", ID_2),
        (f"docker://{ID_3}", ID_3),
        ("", None),
        (None, None),
        (ID_1, None),  # no scheme: not a status containerID
        ("containerd://", None),
    ],
)
def test_container_id_parsing(value: str | None, expected: str | None) -> None:
    assert container_id(value) == expected


def test_init_and_ephemeral_containers_count_too() -> None:
    pod = Pod(
        metadata=ObjectMeta(name="p", namespace="ml", uid=UID_A),
        status=PodStatus(
            initContainerStatuses=[_status("gpu-check", f"containerd://{ID_1}")],
            containerStatuses=[_status("main", f"containerd://{ID_2}")],
            ephemeralContainerStatuses=[_status("debug", f"containerd://{ID_3}")],
        ),
    )
    entry = pod_entry(pod)
    assert entry is not None
    assert dict(entry.containers) == {ID_1: "gpu-check", ID_2: "main", ID_3: "debug"}
    assert pod_entry(Pod(metadata=ObjectMeta(name="p", namespace="ml"))) is None


def _status(name: str, ident: str) -> ContainerStatus:
    return ContainerStatus(
        name=name, containerID=ident, image="i", imageID="", ready=True, restartCount=0
    )


async def test_pods_on_other_nodes_are_ignored(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_pod("ml", "elsewhere", UID_B, "gpu-2", {"main": ID_2})
    api.add_pod("ml", "here", UID_A, NODE, {"main": ID_1})
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        assert pods.uid_map() == {PodUid(UID_A): ("ml", "here")}
        api.add_pod("ml", "elsewhere-2", UID_C, "gpu-2", {"main": ID_3})
        api.delete_pod("ml", "here")
        await until(pods, lambda: pods.uid_map() == {})
        assert pods.container_names() == {}
    watches = [r for r in api.requests if r.query.get("watch") == "true"]
    assert watches
    assert all(r.path == "/api/v1/pods" for r in watches)
    assert all(r.query["fieldSelector"] == f"spec.nodeName={NODE}" for r in watches)


async def test_reconnects_and_relists_after_the_stream_is_cut(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_pod("ml", "a", UID_A, NODE, {"main": ID_1})
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        await server_sees(api, lambda: api.watches_started >= 1)
        api.break_watches()
        # Changes that may land while disconnected must still show up.
        api.delete_pod("ml", "a")
        api.add_pod("ml", "b", UID_B, NODE, {"main": ID_2})
        await until(pods, lambda: pods.uid_map() == {PodUid(UID_B): ("ml", "b")})
        assert pods.container_names() == {ContainerId(ID_2): "main"}
        # And the new watch delivers later changes.
        await until(pods, lambda: pods.lists >= 2)
        await server_sees(api, lambda: api.watches_started >= 2)
        api.add_pod("ml", "c", UID_C, NODE, {"main": ID_3})
        await until(pods, lambda: PodUid(UID_C) in (pods.uid_map() or {}))
    assert pods.reconnects >= 1


async def test_relists_when_the_watch_resumes_from_a_compacted_version(
    api: FakeApiServer, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuslice.k8s.pods")
    api.add_pod("ml", "a", UID_A, NODE, {"main": ID_1})
    # A server that sends no bookmarks (the API allows it): whether the watch starts after
    # the compaction or lightkube resumes it after the 1 s server timeout, it asks for the
    # list's version, which compaction dropped: 410 Gone.
    api.bookmarks = False
    pods = NodePods(client, NODE, backoff=FAST, server_timeout_s=1)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        api.add_pod("other", "x", UID_B, "gpu-2", {"main": ID_2})
        api.add_pod("other", "y", UID_C, "gpu-2", {"main": ID_3})
        api.compact()
        await until(pods, lambda: pods.lists >= 2)
        assert pods.uid_map() == {PodUid(UID_A): ("ml", "a")}
        api.delete_pod("ml", "a")
        await until(pods, lambda: pods.uid_map() == {})
    assert "event=pod-watch-expired" in caplog.text
    assert pods.reconnects >= 1


async def test_bookmarks_keep_an_idle_watch_from_relisting(
    api: FakeApiServer, client: AsyncClient
) -> None:
    """Other nodes' pods move the server's version on while this node's watch sees nothing;
    the bookmark before each server timeout carries the watch's version forward, so a
    compaction does not make it list again."""
    api.add_pod("ml", "a", UID_A, NODE, {"main": ID_1})
    pods = NodePods(client, NODE, backoff=FAST, server_timeout_s=1)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        api.add_pod("other", "x", UID_B, "gpu-2", {"main": ID_2})
        started = api.watches_started
        await server_sees(api, lambda: api.watches_started >= started + 1)  # resumed once
        api.compact()
        await server_sees(api, lambda: api.watches_started >= started + 2)  # and again
        api.delete_pod("ml", "a")
        await until(pods, lambda: pods.uid_map() == {})
        assert pods.lists == 1
        assert pods.reconnects == 0


async def test_retries_through_api_errors(api: FakeApiServer, client: AsyncClient) -> None:
    api.add_pod("ml", "a", UID_A, NODE, {"main": ID_1})
    api.fail_next_requests(3)
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        assert pods.uid_map() == {PodUid(UID_A): ("ml", "a")}
    assert pods.reconnects == 3


async def test_stop_before_the_api_answers(api: FakeApiServer, client: AsyncClient) -> None:
    api.fail_next_requests(1000)
    pods = NodePods(client, NODE, backoff=FAST)
    async with running_pods(pods):
        await server_sees(api, lambda: len(api.requests) >= 3)
    assert pods.uid_map() is None
    assert pods.reconnects >= 2


def test_node_name_is_required(client: AsyncClient) -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        NodePods(client, "")


# -- the double itself: pods and nodes share its history, not their watches ----------------


async def test_node_watches_and_lists_do_not_see_pods(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_node(NODE)
    api.add_pod("ml", "a", UID_A, NODE, {"main": ID_1})
    assert [n.metadata.name async for n in client.list(Node) if n.metadata] == [NODE]
    seen: list[tuple[str, str]] = []
    async with asyncio.timeout(10):
        async for kind, node in client.watch(Node, resource_version="0", server_timeout=1):
            assert node.metadata is not None
            seen.append((kind, str(node.metadata.name)))
            if len(seen) == 1:
                api.add_pod("ml", "b", UID_B, NODE, {"main": ID_2})
                api.set_node_label(NODE, "k", "v")
            else:
                break
    assert seen == [("ADDED", NODE), ("MODIFIED", NODE)]


async def test_namespaced_pod_list_and_unsupported_selectors(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_pod("ml", "a", UID_A, NODE, {"main": ID_1})
    api.add_pod("web", "b", UID_B, NODE, {"main": ID_2})
    names = [p.metadata.name async for p in client.list(Pod, namespace="web") if p.metadata]
    assert names == ["b"]
    everywhere = client.list(Pod, namespace=ALL_NS, fields={"metadata.namespace": "ml"})
    assert [p.metadata.name async for p in everywhere if p.metadata] == ["a"]
    with pytest.raises(ApiError) as caught:
        [n async for n in client.list(Node, fields={"spec.nodeName": NODE})]
    assert caught.value.status.code == 400
