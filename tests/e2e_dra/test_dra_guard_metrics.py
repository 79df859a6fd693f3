"""DRA claims guarded and measured like time-sliced replicas, through the daemon process:
three pods on shares of one simulated L40S (the node config shares it 4 ways), the kubelet's
PodResources reporting their claims, simulated processes in a fake `/proc`. The exporter
labels each pod's series with its claim and its share's memory; the pod that overruns its
share while memory runs short is stopped; a claim whose GuardConfig says `off` is left alone
even over its share and growing (without it, the grower is the one stopped) where the node
allows claims to weaken the guard on shared GPUs (`--memory-guard-claim-override=allow`).
By default it does not: the `off` claim's grower is the one stopped, not its neighbour."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import Popen

from gpuslice.podresources import PodResourcesEmulator
from gpuslice.podresources.claims import ClaimBooks, ClaimDevice
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.envtest import free_port
from tests.e2e.guard_support import CONFIG, WAIT_S, sleeper
from tests.e2e.metrics_support import samples, wait_scrape
from tests.e2e_dra.dra_node import (
    DRIVER,
    NODE,
    DraNode,
    claim_obj,
    opaque,
    request,
    running_dra_node,
)

# The device plugin's guard test's config and processes: here the L40S is offered as shares.
# 46068 MiB in 4 shares: 11517 MiB each; the guard keeps 10 % (4606 MiB) in reserve.
PODS = {"leaker": 1, "steady": 2, "exempt": 3}
GUARD_OFF = {"apiVersion": "resource.gpuslice.io/v1alpha1", "kind": "GuardConfig", "mode": "off"}


@asynccontextmanager
async def share_pods(
    sock_dir: Path, api: FakeApiServer, guard_args: Sequence[str] = ()
) -> AsyncIterator[tuple[DraNode, dict[str, Popen[bytes]], int]]:
    """The agent with the guard enforcing; a claim on a share for each pod of `PODS`
    (`exempt`'s GuardConfig says `off`) booked in PodResources, the pods' processes on the
    GPU (steady 10000 MiB, the others 12000 of their 11517), measured by the exporter."""
    children = {pod: sleeper() for pod in PODS}
    try:
        proc = sock_dir / "proc"
        uids = {pod: f"11111111-2222-4333-8444-{n:012d}" for pod, n in PODS.items()}
        cids = {pod: str(n) * 64 for pod, n in PODS.items()}
        for pod, child in children.items():
            (proc / str(child.pid)).mkdir(parents=True)
            (proc / str(child.pid) / "cgroup").write_text(
                f"0::/kubepods/burstable/pod{uids[pod]}/{cids[pod]}\n"
            )
            api.add_pod("ml", pod, uids[pod], NODE, {"main": f"containerd://{cids[pod]}"})
        port = free_port()
        pr_socket = sock_dir / "pr.sock"
        args = [
            "--metrics-port", str(port),
            "--metrics-interval", "0.2",
            "--proc-root", str(proc),
            "--pod-resources-socket", str(pr_socket),
            "--memory-guard=enforce",
            "--memory-guard-interval=0.2",
            "--memory-guard-grace=0",
            *guard_args,
        ]  # fmt: skip
        books = ClaimBooks()
        async with (
            running_dra_node(sock_dir, api, node="sim:1xl40s", config=CONFIG, args=args) as node,
            PodResourcesEmulator(pr_socket, claims=books),
        ):
            for pod in PODS:
                config = [opaque(GUARD_OFF)] if pod == "exempt" else []
                claim = claim_obj(f"{pod}-gpu", [request("gpu")], config)
                claim["metadata"]["namespace"] = "ml"
                ref = node.allocate(claim, pod_uid=uids[pod])
                (device,) = (await node.prepare(ref))[ref.uid].devices
                assert device.share_id
                books.book(
                    "ml", pod, "main", "ml", f"{pod}-gpu",
                    [ClaimDevice(DRIVER, NODE, device.device, device.share_id, device.cdi_ids)],
                )  # fmt: skip
            node.control.add_process(children["steady"].pid, 0, used_memory_mib=10000)
            node.control.add_process(children["exempt"].pid, 0, used_memory_mib=12000)
            node.control.add_process(children["leaker"].pid, 0, used_memory_mib=12000)
            yield node, children, port
    finally:
        for c in children.values():
            if c.poll() is None:
                c.kill()
            c.wait()


async def test_share_claims_are_measured_and_the_overrunning_one_is_stopped(
    sock_dir: Path, api: FakeApiServer
) -> None:
    allow = ["--memory-guard-claim-override=allow"]
    async with share_pods(sock_dir, api, allow) as (node, children, port):

        def measured(text: str) -> bool:
            got = samples(text, "gpuslice_pod_memory_used_bytes")
            return {lbl.get("claim") for lbl, _ in got} == {f"ml/{p}-gpu" for p in PODS}

        text = await wait_scrape(port, measured, "the three claims' pods")
        entitled = {lbl["pod"]: v for lbl, v in samples(text, "gpuslice_pod_entitled_memory_bytes")}
        assert entitled == dict.fromkeys(PODS, 11517 * 2**20)
        # the exempt claim's pod leaks (the simulator's memory model): memory runs short,
        # and the guard stops the enforced pod over its share, not the exempt one
        node.control.grow_process(children["exempt"].pid, 0, start_mib=12000, rate_mib_s=3000)
        code = await asyncio.to_thread(children["leaker"].wait, WAIT_S)
        assert code == -signal.SIGTERM
        node.control.remove_process(children["leaker"].pid)
        assert children["steady"].poll() is None
        assert children["exempt"].poll() is None, "its claim's GuardConfig says off"

        def reclaimed() -> bool:
            return any(e["reason"] == "GPUMemoryReclaimed" for e in api.events("ml"))

        assert await asyncio.to_thread(api.wait_for, reclaimed, WAIT_S)
        events = [e for e in api.events("ml") if e["reason"] == "GPUMemoryReclaimed"]
        assert [e["involvedObject"]["name"] for e in events] == ["leaker"]


async def test_a_claim_on_a_shared_gpu_cannot_turn_the_guard_off_for_itself(
    sock_dir: Path, api: FakeApiServer
) -> None:
    """By default the node's enforce applies to the `off` claim too, since it shares the
    GPU: its leaking pod is stopped (the largest overrun), not the neighbour borrowing a
    little, and the agent says once that the claim's mode was ignored."""
    async with share_pods(sock_dir, api) as (node, children, _port):
        node.control.grow_process(children["exempt"].pid, 0, start_mib=12000, rate_mib_s=3000)

        def reclaimed() -> bool:
            return any(e["reason"] == "GPUMemoryReclaimed" for e in api.events("ml"))

        assert await asyncio.to_thread(api.wait_for, reclaimed, WAIT_S)
        events = [e for e in api.events("ml") if e["reason"] == "GPUMemoryReclaimed"]
        assert [e["involvedObject"]["name"] for e in events] == ["exempt"]
        assert await asyncio.to_thread(children["exempt"].wait, WAIT_S) == -signal.SIGTERM
        node.control.remove_process(children["exempt"].pid)
        assert children["leaker"].poll() is None, "the neighbour borrowing a little stays"
        assert children["steady"].poll() is None
        ignored = [ln for ln in node.log().splitlines() if "guard-claim-mode-ignored" in ln]
        assert len(ignored) == 1, ignored
        assert "claim=ml/exempt-gpu" in ignored[0]
        assert "asked=off" in ignored[0]
