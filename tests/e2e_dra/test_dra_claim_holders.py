"""One share claim used by several pods, through the daemon process (issue 40, item 5): a
claim on a share of a simulated L40S (11517 MiB, the node config shares it 4 ways) booked in
PodResources for three pods, each using less than the claim but together 12000 MiB; a
neighbour claim's pod within its share; a process outside any pod filling the card until
free memory is under the reserve. The claim is one holder: its pods together are over what
the scheduler reserved, and the enforcing guard stops its largest consumer, and only it."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from gpuslice.podresources import PodResourcesEmulator
from gpuslice.podresources.claims import ClaimBooks, ClaimDevice
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.envtest import free_port
from tests.e2e.guard_support import CONFIG, WAIT_S, sleeper
from tests.e2e_dra.dra_node import DRIVER, NODE, claim_obj, request, running_dra_node

USED_MIB = {"team-0": 4500, "team-1": 4000, "team-2": 3500, "neighbour": 10000}
"""The team's three pods use 12000 MiB of their claim's 11517; outside pods, 20000 more."""


async def test_a_claims_pods_are_held_together_and_its_largest_is_stopped(
    sock_dir: Path, api: FakeApiServer
) -> None:
    children = {pod: sleeper() for pod in USED_MIB}
    outsider = sleeper()
    try:
        proc = sock_dir / "proc"
        uids = {pod: f"11111111-2222-4333-8444-{n:012d}" for n, pod in enumerate(USED_MIB)}
        cids = {pod: str(n) * 64 for n, pod in enumerate(USED_MIB)}
        for pod, child in children.items():
            (proc / str(child.pid)).mkdir(parents=True)
            (proc / str(child.pid) / "cgroup").write_text(
                f"0::/kubepods/burstable/pod{uids[pod]}/{cids[pod]}\n"
            )
            api.add_pod("ml", pod, uids[pod], NODE, {"main": f"containerd://{cids[pod]}"})
        pr_socket = sock_dir / "pr.sock"
        args = [
            "--metrics-port", str(free_port()),
            "--metrics-interval", "0.2",
            "--proc-root", str(proc),
            "--pod-resources-socket", str(pr_socket),
            "--memory-guard=enforce",
            "--memory-guard-interval=0.2",
            "--memory-guard-grace=0",
        ]  # fmt: skip
        books = ClaimBooks()
        async with (
            running_dra_node(sock_dir, api, node="sim:1xl40s", config=CONFIG, args=args) as node,
            PodResourcesEmulator(pr_socket, claims=books),
        ):
            for claim_name, pods in (("team-gpu", ["team-0", "team-1", "team-2"]),
                                     ("neighbour-gpu", ["neighbour"])):  # fmt: skip
                claim = claim_obj(claim_name, [request("gpu")])
                claim["metadata"]["namespace"] = "ml"
                ref = node.allocate(claim, pod_uid=uids[pods[0]])
                (device,) = (await node.prepare(ref))[ref.uid].devices
                assert device.share_id
                for pod in pods:
                    books.book(
                        "ml", pod, "main", "ml", claim_name,
                        [ClaimDevice(DRIVER, NODE, device.device, device.share_id, device.cdi_ids)],
                    )  # fmt: skip
            for pod, child in children.items():
                node.control.add_process(child.pid, 0, used_memory_mib=USED_MIB[pod])
            # no pod's: counted as used, never stopped; free memory falls to 4068 MiB
            node.control.add_process(outsider.pid, 0, used_memory_mib=20000)

            def reclaimed() -> bool:
                return any(e["reason"] == "GPUMemoryReclaimed" for e in api.events("ml"))

            assert await asyncio.to_thread(api.wait_for, reclaimed, WAIT_S)
            assert await asyncio.to_thread(children["team-0"].wait, WAIT_S) == -signal.SIGTERM
            node.control.remove_process(children["team-0"].pid)
            events = [e for e in api.events("ml") if e["reason"] == "GPUMemoryReclaimed"]
            assert [e["involvedObject"]["name"] for e in events] == ["team-0"]
            assert "claim ml/team-gpu's pods use 12000 MiB" in events[0]["message"]
            for pod in ("team-1", "team-2", "neighbour"):
                assert children[pod].poll() is None, pod
            assert outsider.poll() is None
    finally:
        for c in (*children.values(), outsider):
            if c.poll() is None:
                c.kill()
            c.wait()
