"""The memory guard in the real daemon: three pods time-slicing one simulated L40S, one
growing past its share; the guard stops that one (its real process gets SIGTERM) and posts
a Warning Event on its pod, and the others keep running. The leak runs in the simulator's
memory model, driven through the control directory."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from gpuslice.podresources import PodResourcesEmulator
from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.envtest import free_port
from tests.e2e.daemon_fixtures import running_daemon
from tests.e2e.guard_support import CONFIG, NODE, WAIT_S, sleeper
from tests.e2e.metrics_support import samples, wait_scrape

# 46068 MiB, four replicas: 11517 MiB each; reserve 10 % = 4606 MiB.
PODS = {"leaker": 1, "steady": 2, "late": 3}


async def test_the_overrunning_pod_is_stopped_and_the_others_untouched(sock_dir: Path) -> None:
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
        pr_socket = sock_dir / "pr.sock"
        with running_apiserver() as api:
            port = free_port()  # after the double took its ephemeral port: never the same
            api.add_node(NODE)
            for pod in PODS:
                api.add_pod("ml", pod, uids[pod], NODE, {"main": f"containerd://{cids[pod]}"})
            args = [
                "--no-labels",
                "--node-name",
                NODE,
                "--kubeconfig",
                str(api.write_kubeconfig(sock_dir / "kubeconfig")),
                "--metrics-port",
                str(port),
                "--metrics-interval",
                "0.2",
                "--proc-root",
                str(proc),
                "--pod-resources-socket",
                str(pr_socket),
                "--memory-guard=enforce",
                "--memory-guard-interval=0.2",
                "--memory-guard-grace=0",
            ]
            async with running_daemon(sock_dir, CONFIG, node="sim:1xl40s", args=args) as node:
                kubelet = node.kubelet
                async with PodResourcesEmulator(pr_socket, kubelet.assignments):
                    await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
                    for pod in PODS:
                        await kubelet.admit("ml", pod, [("main", {"nvidia.com/gpu": 1})])
                    node.control.add_process(children["steady"].pid, 0, used_memory_mib=10000)
                    node.control.add_process(children["late"].pid, 0, used_memory_mib=6000)
                    node.control.add_process(children["leaker"].pid, 0, used_memory_mib=12000)

                    def over(text: str) -> bool:
                        got = samples(text, "gpuslice_pod_memory_over_share")
                        return {lbl["pod"]: v for lbl, v in got} == {
                            "leaker": 1,
                            "steady": 0,
                            "late": 0,
                        }

                    await wait_scrape(port, over, "the leaker over its share")
                    # Borrowing while memory is free: 18 GiB free, nobody stopped.
                    assert all(c.poll() is None for c in children.values())
                    # Now it leaks, 3000 MiB/s, in the simulator's CUDA-like memory: left
                    # alone it would fill the card in ~6 s and the next allocation would
                    # fail; the guard must stop it when free memory drops below 4606 MiB.
                    node.control.grow_process(
                        children["leaker"].pid, 0, start_mib=12000, rate_mib_s=3000
                    )
                    code = await asyncio.to_thread(children["leaker"].wait, WAIT_S)
                    assert code == -signal.SIGTERM
                    node.control.remove_process(children["leaker"].pid)
                    assert children["steady"].poll() is None
                    assert children["late"].poll() is None

                    def reclaimed() -> bool:
                        return any(e["reason"] == "GPUMemoryReclaimed" for e in api.events("ml"))

                    assert await asyncio.to_thread(api.wait_for, reclaimed, WAIT_S)
                    [event] = [e for e in api.events("ml") if e["reason"] == "GPUMemoryReclaimed"]
                    assert event["involvedObject"]["name"] == "leaker"
                    assert event["involvedObject"]["uid"] == uids["leaker"]
                    # reclaimed at or ahead of the crossing (projection), always saying so
                    message = event["message"]
                    assert "reserve 4606 MiB" in message
                    assert message.endswith(": reclaimed (memory-pressure) with SIGTERM")

                    def counted(text: str) -> bool:
                        got = samples(text, "gpuslice_memory_guard_decisions_total")
                        return ({"kind": "reclaim", "enforced": "true"}, 1.0) in got

                    await wait_scrape(port, counted, "the reclaim counted")
                    assert children["steady"].poll() is None
                    assert children["late"].poll() is None
    finally:
        for c in children.values():
            if c.poll() is None:
                c.kill()
            c.wait()
