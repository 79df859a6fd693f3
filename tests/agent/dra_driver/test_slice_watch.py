"""The slice publisher watches, it does not poll: one LIST, a watch resumed from the last
version after a cut, a LIST again only after 410 Gone, and a wipe repaired from what the
watch shows. Against the API double over real HTTP (`DraApi`, lightkube); the request log
says what the agent sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.backends import open_backend
from gpuslice.core.backoff import Backoff
from gpuslice.core.config import parse_config
from gpuslice.core.sharing.plan import build_plan
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.state import PlanState
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver
from gpuslice.testing.eventually import eventually

DRIVER = "gpu.nvidia.com"
NODE = "n1"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class Running:
    api: FakeApiServer
    publisher: SlicePublisher
    state: PlanState

    def slice_requests(self, watch: bool) -> int:
        """GETs of this node's slices the server saw: watches or lists."""
        return sum(
            1
            for r in self.api.requests
            if r.method == "GET"
            and r.path.startswith(SLICES)
            and (r.query.get("watch") == "true") == watch
        )


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    backend = open_backend("sim:2xh100-80gb")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    with running_apiserver() as api:
        api.add_node(NODE)
        client = make_client(api.kubeconfig(), trust_env=False)
        publisher = SlicePublisher(
            DraApi(client, NODE, DRIVER),
            driver=DRIVER,
            node=NODE,
            snapshot=lambda: state.current,
            backoff=Backoff(initial_s=0.05, maximum_s=0.2),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(publisher.run(stop, state))
        try:
            await asyncio.wait_for(publisher.published.wait(), 10)
            yield Running(api, publisher, state)
        finally:
            stop.set()
            await task
            await client.close()


async def test_a_wipe_is_repaired_from_the_watch_without_a_list(running: Running) -> None:
    api, publisher = running.api, running.publisher
    [before] = api.resource_slices(NODE, DRIVER)
    assert api.delete_all_slices(NODE) == 1
    await eventually(lambda: len(api.resource_slices(NODE, DRIVER)) == 1, "the slice back")
    [after] = api.resource_slices(NODE, DRIVER)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["spec"]["devices"] == before["spec"]["devices"]
    assert publisher.lists == 1
    assert running.slice_requests(watch=False) == 1


async def test_a_cut_watch_resumes_and_410_lists_again(running: Running) -> None:
    api, publisher = running.api, running.publisher
    watches = running.slice_requests(watch=True)
    api.break_watches()
    await eventually(lambda: running.slice_requests(watch=True) > watches, "the watch resumed")
    assert publisher.lists == 1, "a cut stream is resumed from its version, not re-listed"
    # history compacted while the watch is cut: the resume gets 410 and lists again
    api.add_node("other")  # moves the server's version past the watch's
    api.compact()
    api.break_watches()
    await eventually(lambda: publisher.lists == 2, "listed again after 410")
    assert running.slice_requests(watch=False) == 2
    # and the watch still works: a wipe is repaired
    api.delete_all_slices(NODE)
    await eventually(lambda: len(api.resource_slices(NODE, DRIVER)) == 1, "the slice back")


async def test_its_own_writes_are_not_rewritten(running: Running) -> None:
    """The watch echoes the agent's own publish; nothing is written again at rest."""
    publisher = running.publisher
    writes = publisher.publishes
    assert writes >= 1
    # every write echoed (one event each on this server), then two further rounds of
    # comparing: each must find the stored slices (in the server's spelling) as wanted
    await eventually(lambda: publisher.events >= writes, "the echo of each write")

    async def one_more_round() -> None:
        rounds = publisher.rounds
        running.state.publish()  # a new snapshot with nothing changed: one more round
        await eventually(lambda: publisher.rounds > rounds, "one more publish round")

    await one_more_round()
    await one_more_round()
    assert publisher.publishes == writes
    assert publisher.lists == 1


async def test_a_server_without_effect_none_gets_the_slices_without_informational_taints() -> None:
    """A 1.34 server refuses the taint effect `None` (422): the publisher drops the
    informational taints for good and publishes the rest (health, cordon) rather than
    nothing at all, which would leave every later change unpublished."""
    backend = open_backend("sim:2xh100-80gb")
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    g0, g1 = (g.uuid for g in inventory.gpus)
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    state.publish(noticed={g0: 43}, cordoned=frozenset({g1}))
    with running_apiserver() as api:
        api.taint_effects = ("NoExecute", "NoSchedule")
        api.add_node(NODE)
        client = make_client(api.kubeconfig(), trust_env=False)
        try:
            publisher = SlicePublisher(
                DraApi(client, NODE, DRIVER),
                driver=DRIVER,
                node=NODE,
                snapshot=lambda: state.current,
            )
            assert (await publisher.publish_once()).create
            assert not publisher.informational
            [stored] = api.resource_slices(NODE)
            taints = {d["name"]: d.get("taints", []) for d in stored["spec"]["devices"]}
            assert taints["gpu-0"] == []
            assert [t["key"] for t in taints["gpu-1"]] == ["gpuslice.io/gpu-cordon"]
        finally:
            await client.close()
