"""MIG changes on a running node, through a real daemon process: no restart, no crash loop.

Seed 001: after `nvidia-smi mig -cgi` NVIDIA's plugin exits with "invalid MIG configuration"
and crash-loops until its pod is deleted. Here the daemon starts on a layout `single` cannot
serve, stays up with GFD's `-MIG-INVALID` labels and a Warning Event, and advertises the
MIG devices as soon as the layout is fixed through the simulator's control directory; a MIG
mode switch on the running node is picked up the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.testing.apiserver import FakeApiServer, running_apiserver
from tests.e2e.daemon_fixtures import running_daemon

WAIT_S = 20.0
NODE = "gpu-node-1"
SINGLE = "version: v1\nflags:\n  migStrategy: single\n"


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        yield server


def _labels(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.parametrize(
    "interval",
    ["0.2", "3600"],
    ids=["periodic-re-read", "backend-event"],  # 3600: only the MIG change event can do it
)
async def test_invalid_single_layout_stays_up_and_recovers_live(
    sock_dir: Path, apiserver: FakeApiServer, interval: str
) -> None:
    apiserver.add_node(NODE)
    labels_file = sock_dir / "features.d" / "gfd"
    kubeconfig = apiserver.write_kubeconfig(sock_dir / "kubeconfig")
    args = [
        "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--namespace", "gpu-system",
        "--labels-file", str(labels_file), "--no-timestamp", "--inventory-interval", interval,
    ]  # fmt: skip
    node_spec = "sim:1xa100-80gb/mig=1g.10gb*7,1xa100-80gb"  # GPU 1 out of MIG mode
    async with running_daemon(sock_dir, SINGLE, node=node_spec, args=args, expect="") as node:
        kubelet = node.kubelet
        await kubelet.wait_for(
            lambda: (
                _labels(labels_file).get("nvidia.com/gpu.product")
                == "NVIDIA-A100-80GB-PCIe-MIG-INVALID"
            ),
            WAIT_S,
        )
        labels = _labels(labels_file)
        assert labels["nvidia.com/gpu.count"] == "0"
        assert labels["nvidia.com/gpu.memory"] == "0"
        assert apiserver.wait_for(
            lambda: any(e.get("reason") == "MigLayoutInvalid" for e in apiserver.events()),
            WAIT_S,
        )
        (event,) = [e for e in apiserver.events() if e.get("reason") == "MigLayoutInvalid"]
        assert event["type"] == "Warning"
        assert "same migEnabled value" in event["message"]
        assert "use migStrategy 'mixed'" in event["message"]
        assert node.daemon.running
        assert kubelet.capacity("nvidia.com/gpu") == 0

        # The operator partitions GPU 1 like GPU 0: the MIG devices appear, no restart.
        node.control.set_mig(1, enabled=True, layout="1g.10gb*7")
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 14, WAIT_S)
        await kubelet.wait_for(
            lambda: (
                _labels(labels_file).get("nvidia.com/gpu.product")
                == "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb"
            ),
            WAIT_S,
        )
        assert _labels(labels_file)["nvidia.com/gpu.count"] == "14"

        # MIG mode switched off on both GPUs of the running node: whole GPUs again.
        node.control.set_mig(0, enabled=False)
        node.control.set_mig(1, enabled=False)
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 2, WAIT_S)
        await kubelet.wait_for(
            lambda: _labels(labels_file).get("nvidia.com/gpu.product") == "NVIDIA-A100-80GB-PCIe",
            WAIT_S,
        )
        assert node.daemon.running
        assert "Traceback" not in node.daemon.log()
