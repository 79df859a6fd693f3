"""NodePods (the node's pods, for naming GPU processes' pods and containers) against the
double and a real kube-apiserver alike: pods bound to the node arrive with their container
IDs, a restarted container's new ID replaces the old, other nodes' pods are not seen, a
deleted pod leaves, and a restart of the API server (its watch cut, its history gone) is
followed by a re-list that sees what changed meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lightkube import AsyncClient

from gpuslice.core.cgroups import ContainerId, PodUid
from gpuslice.k8s import Backoff, NodePods, make_client
from gpuslice.testing.kubes import Kube, pods_until, running_pods

FAST = Backoff(initial_s=0.01, maximum_s=0.05)
ID_1, ID_2, ID_3 = "1" * 64, "2" * 64, "3" * 64


async def until(pods: NodePods, predicate: Callable[[], bool]) -> None:
    await pods_until(pods, predicate, 20)


async def test_pods_arrive_change_and_leave(kube: Kube, client: AsyncClient) -> None:
    node, other = kube.name("gpu-1"), kube.name("gpu-2")
    namespace = kube.name("ml")
    pods = NodePods(client, node, backoff=FAST)
    async with running_pods(pods):
        await until(pods, lambda: pods.lists >= 1)
        assert pods.uid_map() == {}
        a = PodUid(kube.add_pod(namespace, "a", node, {"main": ""}))  # not started yet
        await until(pods, lambda: pods.uid_map() == {a: (namespace, "a")})
        assert pods.container_names() == {}
        kube.set_pod_containers(namespace, "a", {"main": f"containerd://{ID_1}"})
        await until(pods, lambda: pods.container_names() == {ContainerId(ID_1): "main"})
        # a container restart gets a new ID; the old one must not stay attributed
        kube.set_pod_containers(namespace, "a", {"main": f"cri-o://{ID_2}"})
        await until(pods, lambda: pods.container_names() == {ContainerId(ID_2): "main"})
        kube.add_pod(namespace, "elsewhere", other, {"main": ID_3})
        b = PodUid(kube.add_pod(namespace, "b", node, {"worker": ID_3}))
        await until(pods, lambda: b in (pods.uid_map() or {}))
        kube.delete_pod(namespace, "a")
        await until(pods, lambda: pods.uid_map() == {b: (namespace, "b")})
        assert pods.container_names() == {ContainerId(ID_3): "worker"}
    assert pods.lists == 1
    assert pods.reconnects == 0


async def test_a_restart_of_the_api_server_is_followed_by_a_relist(
    restartable_kube: Kube,
) -> None:
    kube = restartable_kube
    node, namespace = kube.name("gpu-1"), kube.name("ml")
    a = PodUid(kube.add_pod(namespace, "a", node, {"main": ID_1}))
    c = make_client(kube.kubeconfig, trust_env=False)
    try:
        pods = NodePods(c, node, backoff=FAST)
        async with running_pods(pods):
            await until(pods, lambda: pods.uid_map() == {a: (namespace, "a")})
            kube.set_pod_containers(namespace, "a", {"main": ID_3})
            # seen after the list, so by the watch: it is open when the server goes
            await until(pods, lambda: pods.container_names() == {ContainerId(ID_3): "main"})
            await asyncio.to_thread(kube.restart)
            kube.delete_pod(namespace, "a")
            b = PodUid(kube.add_pod(namespace, "b", node, {"main": ID_2}))
            await until(pods, lambda: pods.uid_map() == {b: (namespace, "b")})
            assert pods.container_names() == {ContainerId(ID_2): "main"}
        assert pods.lists >= 2
        assert pods.reconnects >= 1
    finally:
        await c.close()
