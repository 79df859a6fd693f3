"""A config path that goes missing, dangles, loops or empties is logged and posted as a
Warning Event (through the same listener as any rejected config); the devices stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuslice.testing.apiserver import running_apiserver
from gpuslice.testing.hostile_configs import HOSTILE
from tests.e2e.daemon_fixtures import running_daemon

WAIT_S = 20.0
NODE = "gpu-node-1"
TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)


async def test_missing_dangling_looping_and_empty_paths_post_events(sock_dir: Path) -> None:
    with running_apiserver() as api:
        api.add_node(NODE, {})
        kubeconfig = api.write_kubeconfig(sock_dir / "kubeconfig")
        args = [
            "--no-labels",
            "--config-poll-interval",
            "0.1",
            "--node-name",
            NODE,
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            "gpu-system",
        ]
        async with running_daemon(sock_dir, TS4, args=args) as node:
            kubelet = node.kubelet
            await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
            expected = {
                "missing": "No such file",
                "symlink-loop": "Too many levels of symbolic links",
                "dangling-symlink": "No such file",
                "empty-directory": "holds no config files",
            }
            for name, words in expected.items():
                HOSTILE[name](node.config)

                def posted(w: str = words) -> bool:
                    return any(
                        e.get("reason") == "ConfigRejected" and w in str(e.get("message"))
                        for e in api.events()
                    )

                assert await asyncio.to_thread(api.wait_for, posted, WAIT_S), (name, api.events())
                assert kubelet.capacity("nvidia.com/gpu") == 8, name
            assert node.daemon.running
            assert "event=config-rejected" in node.daemon.log()
