"""Per-node configs chosen by the node label, reloaded live, through a real daemon process.

The Kubernetes API is the in-test HTTP double (`gpuslice.testing.apiserver`), reached by the
daemon's lightkube client over a kubeconfig; the kubelet is the emulator. What is checked is
what a platform engineer sees: the node's device list changes with the label, a bad config
is refused with a Warning Event and the old devices stay, and the GFD label file follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.testing.apiserver import FakeApiServer, running_apiserver
from tests.e2e.daemon_fixtures import running_daemon

WAIT_S = 10.0
NODE = "gpu-node-1"
LABEL = "nvidia.com/device-plugin.config"


def ts(replicas: int, rename: bool = False) -> str:
    extra = "    renameByDefault: true\n" if rename else ""
    return (
        "version: v1\nsharing:\n  timeSlicing:\n"
        f"{extra}    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


CONFIGS = {
    "default": "",  # the Helm `config.map` form: an empty entry = no sharing
    "tesla-t4": ts(4),
    "shared": ts(2, rename=True),
    "broken": ts(4).replace("replicas: 4", "replicas: 0"),
}


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        yield server


def _args(api: FakeApiServer, workdir: Path, *extra: str) -> list[str]:
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    return [
        "--node-name",
        NODE,
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        "gpu-system",
        "--default-config",
        "default",
        *extra,
    ]


def _reasons(api: FakeApiServer) -> list[str]:
    return [str(e.get("reason")) for e in api.events()]


async def test_node_label_selects_config_and_reloads_live(
    sock_dir: Path, apiserver: FakeApiServer
) -> None:
    apiserver.add_node(NODE, {LABEL: "tesla-t4"})
    labels_file = sock_dir / "features.d" / "gfd"
    args = _args(apiserver, sock_dir, "--labels-file", str(labels_file), "--no-timestamp")
    async with running_daemon(sock_dir, CONFIGS, node="sim:4xt4", args=args) as node:
        kubelet = node.kubelet
        # the label's config is the first one applied (the daemon waited for the label)
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 16, WAIT_S)
        await kubelet.wait_for(labels_file.exists, WAIT_S)
        labels = dict(line.split("=", 1) for line in labels_file.read_text().splitlines() if line)
        assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
        assert labels["nvidia.com/gpu.replicas"] == "4"
        assert labels["nvidia.com/gpu.count"] == "4"
        assert "nvidia.com/gfd.timestamp" not in labels

        # relabel: renameByDefault moves all replicas to nvidia.com/gpu.shared, no restart
        registrations = kubelet.registrations["nvidia.com/gpu.shared"]
        apiserver.set_node_label(NODE, LABEL, "shared")
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu.shared") == 8, WAIT_S)
        await kubelet.wait_for(lambda: not kubelet.has("nvidia.com/gpu"), WAIT_S)
        assert registrations == 0
        await kubelet.wait_for(
            lambda: "nvidia.com/gpu.product=Tesla-T4\n" in labels_file.read_text(), WAIT_S
        )
        # the Event is posted after the plan's hooks (the label file) ran: wait for it
        assert apiserver.wait_for(lambda: "ConfigApplied" in _reasons(apiserver), WAIT_S)

        # a bad config: refused, Warning Event, the shared devices stay advertised
        apiserver.set_node_label(NODE, LABEL, "broken")
        assert apiserver.wait_for(lambda: "ConfigRejected" in _reasons(apiserver), WAIT_S)
        rejected = next(e for e in apiserver.events() if e.get("reason") == "ConfigRejected")
        assert rejected["type"] == "Warning"
        assert "replicas: must be >= 1, got 0" in rejected["message"]
        assert kubelet.capacity("nvidia.com/gpu.shared") == 8
        assert node.daemon.running

        # removing the label falls back to DEFAULT_CONFIG ("default": no sharing)
        apiserver.set_node_label(NODE, LABEL, None)
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 4, WAIT_S)
        await kubelet.wait_for(lambda: not kubelet.has("nvidia.com/gpu.shared"), WAIT_S)
    assert not labels_file.exists(), "the label file is removed on shutdown, as GFD does"


async def test_unknown_config_name_is_refused_and_plan_kept(
    sock_dir: Path, apiserver: FakeApiServer
) -> None:
    apiserver.add_node(NODE, {LABEL: "tesla-t4"})
    async with running_daemon(
        sock_dir, CONFIGS, args=_args(apiserver, sock_dir, "--no-labels")
    ) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        apiserver.set_node_label(NODE, LABEL, "a100-80gb")
        assert apiserver.wait_for(lambda: "ConfigRejected" in _reasons(apiserver), WAIT_S)
        message = next(
            e["message"] for e in apiserver.events() if e.get("reason") == "ConfigRejected"
        )
        assert "a100-80gb" in message
        assert kubelet.capacity("nvidia.com/gpu") == 8


async def test_labels_patched_through_the_api(sock_dir: Path, apiserver: FakeApiServer) -> None:
    apiserver.add_node(NODE, {LABEL: "tesla-t4", "team": "ml"})
    args = _args(apiserver, sock_dir, "--labels-mode", "api")
    async with running_daemon(sock_dir, CONFIGS, node="sim:2xt4", args=args) as node:
        await node.kubelet.wait_for(lambda: node.kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        assert apiserver.wait_for(
            lambda: (
                apiserver.node(NODE)["metadata"]["labels"].get("nvidia.com/gpu.product")
                == "Tesla-T4-SHARED"
            ),
            WAIT_S,
        )
        labels = apiserver.node(NODE)["metadata"]["labels"]
        assert labels["team"] == "ml", "labels gpuslice did not write are left alone"
        assert labels["nvidia.com/gpu.replicas"] == "4"


CORDON = "gpuslice.io/gpu-cordon"


async def test_a_gpu_cordoned_by_annotation_is_unhealthy_until_lifted(
    sock_dir: Path, apiserver: FakeApiServer
) -> None:
    """`gpuslice.io/gpu-cordon` on the Node: every replica of the named GPUs is listed
    Unhealthy (capacity stays, allocatable drops), a Normal Event names them, an entry that
    names no GPU is a Warning Event and skipped; removing the annotation lifts it."""
    apiserver.add_node(NODE, {LABEL: "tesla-t4"})
    args = _args(apiserver, sock_dir, "--no-labels")
    async with running_daemon(sock_dir, CONFIGS, node="sim:4xt4", args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 16, WAIT_S)
        apiserver.set_node_annotation(NODE, CORDON, "1, no-such-gpu")
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 12, WAIT_S)
        assert kubelet.capacity("nvidia.com/gpu") == 16
        sick = {i for i, h in kubelet.devices("nvidia.com/gpu").items() if h == "Unhealthy"}
        assert len(sick) == 4
        assert apiserver.wait_for(lambda: "GpuCordonEntrySkipped" in _reasons(apiserver), WAIT_S)
        events = {str(e["reason"]): e for e in apiserver.events()}
        assert events["GpuCordoned"]["message"].startswith(f"cordoned by {CORDON}: 1 (GPU-")
        assert "'no-such-gpu'" in events["GpuCordonEntrySkipped"]["message"]
        assert events["GpuCordonEntrySkipped"]["type"] == "Warning"
        apiserver.set_node_annotation(NODE, CORDON, None)
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 16, WAIT_S)
        assert apiserver.wait_for(lambda: "GpuCordonLifted" in _reasons(apiserver), WAIT_S)
        assert node.daemon.running


async def test_a_cordon_set_before_the_agent_starts_is_in_its_first_device_list(
    sock_dir: Path, apiserver: FakeApiServer
) -> None:
    """The watch delivers the annotation with the label, before the first plan: the kubelet
    never sees the cordoned GPU's replicas as allocatable."""
    apiserver.add_node(NODE, {LABEL: "tesla-t4"})
    apiserver.set_node_annotation(NODE, CORDON, "0")
    args = _args(apiserver, sock_dir, "--no-labels")
    async with running_daemon(sock_dir, CONFIGS, node="sim:2xt4", args=args) as node:
        kubelet = node.kubelet
        await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, WAIT_S)
        assert kubelet.allocatable("nvidia.com/gpu") == 4
