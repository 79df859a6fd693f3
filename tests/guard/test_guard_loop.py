"""The guard loop end to end below the daemon: real child processes as pods' GPU processes,
a fake /proc, Events and evictions through the Kubernetes API double, counters scraped
from a real registry."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import AsyncClient
from prometheus_client import CollectorRegistry, generate_latest

from gpuslice.core.cgroups import PodUid
from gpuslice.core.dra.claims import daemon_spec
from gpuslice.core.guard import (
    ContainerKey,
    GpuMemory,
    GuardParams,
    Reserve,
    Tenant,
)
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.emulator.fake_mps_control import SERVER_ENV
from gpuslice.guard import GuardView, MemoryGuard, ProcessSignaller
from gpuslice.k8s import PodEvents, PodEvictor, make_client
from gpuslice.metrics.plugin import PluginMetrics
from gpuslice.metrics.procfs import cgroup_identities
from gpuslice.mps import ControlProgram, MpsDaemonManager, MpsTimings
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver
from gpuslice.testing.eventually import eventually
from tests.guard.guard_procs import AGENT_POD, in_pod, sleeper

GIB = 1024**3
FAKE_MPS = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")
TOTAL = 48 * GIB
SHARE = TOTAL // 4
NODE = "gpu-node"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
async def client(api: FakeApiServer) -> AsyncIterator[AsyncClient]:
    c = make_client(api.kubeconfig(), trust_env=False)
    try:
        yield c
    finally:
        await c.close()


@dataclass
class Pod:
    name: str
    uid: str
    container_id: str
    used_gib: float
    proc: subprocess.Popen[bytes]


@pytest.fixture
def pods(tmp_path: Path, api: FakeApiServer) -> Iterator[dict[str, Pod]]:
    out: dict[str, Pod] = {}
    for i, (name, used) in enumerate([("leaker", 30.0), ("steady", 10.0), ("late", 6.0)]):
        uid = f"1f3a5c7e-0000-4000-8000-{i:012d}"
        cid = f"{i}" * 64
        p = sleeper()
        in_pod(tmp_path, p.pid, uid, cid)
        api.add_pod("ml", name, uid, NODE, {"main": f"containerd://{cid}"})
        out[name] = Pod(name, uid, cid, used, p)
    yield out
    for pod in out.values():
        if pod.proc.poll() is None:
            pod.proc.kill()
        pod.proc.wait()


def reader(tmp_path: Path, pods: dict[str, Pod], mps: frozenset[str] = frozenset()):  # type: ignore[no-untyped-def]
    async def read() -> GuardView:
        live = [p for p in pods.values() if p.proc.poll() is None]
        tenants = tuple(
            Tenant(
                ContainerKey("ml", p.name, "main"),
                "GPU-0",
                SharingStrategy.MPS if p.name in mps else SharingStrategy.TIME_SLICING,
                SHARE,
                int(p.used_gib * GIB),
                (p.proc.pid,),
            )
            for p in live
        )
        used = sum(t.used_bytes for t in tenants)
        return GuardView(
            (GpuMemory("GPU-0", 0, TOTAL, TOTAL - used),),
            tenants,
            cgroup_identities((p.proc.pid for p in live), tmp_path),
        )

    return read


def guard(  # type: ignore[no-untyped-def]
    tmp_path: Path, pods: dict[str, Pod], client: AsyncClient, mode: str = "enforce", **kw
) -> tuple[MemoryGuard, CollectorRegistry]:
    registry = CollectorRegistry()
    counters = PluginMetrics(registry)
    events = PodEvents(client, NODE)
    g = MemoryGuard(
        read=reader(tmp_path, pods),
        params=GuardParams(mode=mode, reserve=Reserve(bytes=4 * GIB), grace_s=0),  # type: ignore[arg-type]
        signaller=ProcessSignaller(tmp_path, own_pod=PodUid(AGENT_POD)),
        post_event=events.post,
        on_decision=lambda d: counters.record_guard_decision(d.kind, d.enforced),
        **kw,
    )
    return g, registry


def counter(registry: CollectorRegistry, kind: str, enforced: str) -> float:
    value = registry.get_sample_value(
        "gpuslice_memory_guard_decisions_total", {"kind": kind, "enforced": enforced}
    )
    return value or 0.0


async def test_enforce_stops_the_overrunning_pod_and_tells_its_owner(
    tmp_path: Path, pods: dict[str, Pod], api: FakeApiServer, client: AsyncClient
) -> None:
    g, registry = guard(tmp_path, pods, client)
    ev = await g.poll()
    assert ev is not None
    assert pods["leaker"].proc.wait(10) == -signal.SIGTERM
    assert pods["steady"].proc.poll() is None
    assert pods["late"].proc.poll() is None
    events = {(e["involvedObject"]["name"], e["reason"]): e for e in api.events("ml")}
    assert set(events) == {("leaker", "GPUMemoryOverShare"), ("leaker", "GPUMemoryReclaimed")}
    reclaimed = events[("leaker", "GPUMemoryReclaimed")]
    assert reclaimed["type"] == "Warning"
    assert reclaimed["involvedObject"]["kind"] == "Pod"
    assert reclaimed["involvedObject"]["uid"] == pods["leaker"].uid
    assert reclaimed["message"] == (
        "container main uses 30720 MiB of GPU 0 (GPU-0), its share is 12288 MiB; "
        "2048 MiB free, reserve 4096 MiB: reclaimed (memory-pressure) with SIGTERM"
    )
    assert counter(registry, "reclaim", "true") == 1
    assert counter(registry, "over-share", "false") == 1
    assert b"gpuslice_memory_guard_decisions_total" in generate_latest(registry)
    # The leaker is gone; nothing else is over its share; the next poll does nothing.
    ev = await g.poll()
    assert ev is not None
    assert ev.decisions == ()
    assert ev.state.stopping == {}


async def test_observe_only_reports(
    tmp_path: Path, pods: dict[str, Pod], api: FakeApiServer, client: AsyncClient
) -> None:
    g, registry = guard(tmp_path, pods, client, mode="observe")
    await g.poll()
    assert all(p.proc.poll() is None for p in pods.values())
    reasons = sorted(e["reason"] for e in api.events("ml"))
    assert reasons == ["GPUMemoryOverShare", "GPUMemoryOverShare"]
    assert any("observe mode" in e["message"] for e in api.events("ml"))
    assert counter(registry, "reclaim", "false") == 1
    assert counter(registry, "reclaim", "true") == 0


async def test_evict_goes_through_the_eviction_api_and_retries_when_refused(
    tmp_path: Path, pods: dict[str, Pod], api: FakeApiServer, client: AsyncClient
) -> None:
    g, _registry = guard(tmp_path, pods, client, action="evict", evict=PodEvictor(client).evict)
    api.block_evictions = True  # a PodDisruptionBudget allows no disruption
    await g.poll()
    assert api.evictions == []
    assert g.state.stopping == {}  # not counted as being freed: the next poll tries again
    api.block_evictions = False
    await g.poll()
    assert api.evictions == [("ml", "leaker")]
    assert all(p.proc.poll() is None for p in pods.values())  # eviction, not signals
    with pytest.raises(KeyError):
        api.pod("ml", "leaker")


async def test_the_agents_own_pod_is_never_reclaimed(
    tmp_path: Path, pods: dict[str, Pod], client: AsyncClient
) -> None:
    leaker = pods["leaker"]
    g, _registry = guard(tmp_path, pods, client)
    g.signaller = ProcessSignaller(tmp_path, own_pod=PodUid(leaker.uid))
    await g.poll()
    assert leaker.proc.poll() is None
    assert g.state.stopping == {}


async def test_an_mps_share_over_its_share_is_terminated_by_its_server_then_signalled(
    sock_dir: Path,
    tmp_path: Path,
    pods: dict[str, Pod],
    api: FakeApiServer,
    client: AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An MPS client over its share (it unset its limit: the share daemon's default is the
    largest share on the GPU) is stopped by the enforcing guard, through its server's
    `terminate_client` first, as NVIDIA's MPS documentation asks (a client killed without
    it may hang its server and the other clients), then SIGTERM."""
    monkeypatch.setenv(SERVER_ENV, "4242")  # the fake daemon's running MPS server
    spec = daemon_spec("shares-test", str(sock_dir), [("GPU-0", 0)], thread_percentage=25)
    manager = MpsDaemonManager(
        [spec], ControlProgram.factory(FAKE_MPS), timings=MpsTimings(start_poll_s=0.05)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        await eventually(lambda: manager.ready(spec.resource), "the MPS daemon answering")
        g = MemoryGuard(
            read=reader(tmp_path, pods, mps=frozenset({"leaker"})),
            params=GuardParams(mode="enforce", reserve=Reserve(bytes=4 * GIB), grace_s=0),
            signaller=ProcessSignaller(tmp_path, own_pod=PodUid(AGENT_POD)),
            post_event=PodEvents(client, NODE).post,
            terminate_mps_clients=manager.terminate_clients,
        )
        await g.poll()
        assert pods["leaker"].proc.wait(10) == -signal.SIGTERM
        assert pods["steady"].proc.poll() is None
    finally:
        stop.set()
        await task
    sent = (Path(spec.log_dir) / "control.log").read_text()
    assert f"Command: terminate_client 4242 {pods['leaker'].proc.pid}" in sent
    [reclaimed] = [e for e in api.events("ml") if e["reason"] == "GPUMemoryReclaimed"]
    assert reclaimed["message"].endswith(
        "reclaimed (memory-pressure) with terminate_client+SIGTERM"
    )
